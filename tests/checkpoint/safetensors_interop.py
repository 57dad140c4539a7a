#!/usr/bin/env python3
"""safetensors interop check for tandem, with an independent parser.

It reads and writes the format itself (json + torch.frombuffer), the way the
reference implementation lays files out, and checks tandem's CRC-32C with its
own table code; `load`, `model` and `resave` also use the `safetensors`
package itself.

  safetensors_interop.py check FILE   FILE was written by tandem: check its layout,
                                      checksums and values (the test formula)
  safetensors_interop.py write FILE   write the formula tensors as a foreign
                                      writer would (no checksums, other order)
  safetensors_interop.py load FILE    load any tandem-written file into torch
                                      tensors (like safetensors.torch.load_file)
                                      and check each tensor's bytes, as loaded,
                                      against the CRC-32C the C++ writer recorded;
                                      with the safetensors package installed, also
                                      check that its load_file gives the same
  safetensors_interop.py model FILE EXPECTED
                                      (needs the safetensors package) save the
                                      test's TiedNet with save_model to FILE, and
                                      its eval-mode logits for fixed tokens to
                                      EXPECTED
  safetensors_interop.py resave IN OUT
                                      (needs the safetensors package) load_file IN,
                                      save_file OUT
  safetensors_interop.py save_file FILE
                                      (needs the safetensors package) write the
                                      formula tensors with save_file
  safetensors_interop.py load_file FILE
                                      (needs the safetensors package) check that
                                      load_file gives the formula tensors, bit for bit

Prints "ok ..." and exits 0 on success; prints the reason and exits 1 otherwise.
"""
import json
import struct
import sys

import torch

DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U8": torch.uint8, "BOOL": torch.bool,
    "U64": torch.uint64, "U32": torch.uint32, "U16": torch.uint16,
    "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
    "F8_E4M3FNUZ": torch.float8_e4m3fnuz, "F8_E5M2FNUZ": torch.float8_e5m2fnuz,
    "F8_E8M0": torch.float8_e8m0fnu,
}
UNSIGNED = (torch.uint8, torch.uint16, torch.uint32, torch.uint64)
NAMES = {v: k for k, v in DTYPES.items()}

# Same list as formula_specs() in safetensors_test_util.h.
SPECS = [
    ("f64", torch.float64, [2, 3]), ("f32", torch.float32, [4, 5, 6]),
    ("f16", torch.float16, [3, 8]), ("bf16", torch.bfloat16, [24]),
    ("i64", torch.int64, [5]), ("i32", torch.int32, [2, 2]), ("i16", torch.int16, [7]),
    ("i8", torch.int8, [9]), ("u8", torch.uint8, [10]), ("bool", torch.bool, [11]),
    ("u64", torch.uint64, [3]), ("u32", torch.uint32, [2, 3]), ("u16", torch.uint16, [5]),
    ("f8_e4m3", torch.float8_e4m3fn, [4, 6]), ("f8_e5m2", torch.float8_e5m2, [25]),
    ("f8_e4m3fnuz", torch.float8_e4m3fnuz, [7]), ("f8_e5m2fnuz", torch.float8_e5m2fnuz, [2, 4]),
    ("f8_e8m0", torch.float8_e8m0fnu, [20]),
    ("scalar", torch.float32, []), ("empty", torch.float32, [0, 3]),
]


def formula(dtype, shape):
    """The test formula of safetensors_test_util.h."""
    n = 1
    for d in shape:
        n *= d
    i = torch.arange(n, dtype=torch.float64)
    if dtype is torch.bool:
        v = torch.remainder(i, 3) == 0
    elif dtype is torch.float8_e8m0fnu:
        v = torch.exp2(torch.remainder(i, 16) - 8)
    elif dtype.is_floating_point:
        v = i * 0.25 - 3.0
    elif dtype in UNSIGNED:
        v = torch.remainder(i * 7 + 3, 200)
    else:
        v = torch.remainder(i * 7 + 3, 200) - 100
    return v.to(dtype).reshape(shape)


def _crc32c_table():
    table = []
    for b in range(256):
        crc = b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
        table.append(crc)
    return table


CRC_TABLE = _crc32c_table()


def crc32c(data):
    crc = 0xFFFFFFFF
    for byte in data:
        crc = (crc >> 8) ^ CRC_TABLE[(crc ^ byte) & 0xFF]
    return crc ^ 0xFFFFFFFF


def fail(message):
    print("FAIL: " + message)
    sys.exit(1)


def check(path):
    blob = bytearray(open(path, "rb").read())
    (n,) = struct.unpack("<Q", bytes(blob[:8]))
    if (8 + n) % 8:
        fail(f"data section starts at {8 + n}, not 8-byte aligned")
    header = json.loads(bytes(blob[8:8 + n]).decode("utf-8"))
    meta = header.pop("__metadata__", {})
    crcs = json.loads(meta.get("tandem.crc32c", "{}"))
    data = blob[8 + n:]
    expected = {name: (dtype, shape) for name, dtype, shape in SPECS}
    if set(header) != set(expected):
        fail(f"tensors {sorted(header)}, expected {sorted(expected)}")
    if set(crcs) != set(header) | {"__header__"}:
        fail(f"tandem.crc32c names {sorted(crcs)}")
    covered = 0
    for name, info in header.items():
        begin, end = info["data_offsets"]
        covered += end - begin
        dtype = DTYPES[info["dtype"]]
        if (dtype, info["shape"]) != expected[name]:
            fail(f"{name}: {info['dtype']} {info['shape']}, expected {expected[name]}")
        raw = bytes(data[begin:end])
        if crcs.get(name) != "%08x" % crc32c(raw):
            fail(f"{name}: checksum {crcs.get(name)}, computed {crc32c(raw):08x}")
        if end > begin:
            count = (end - begin) // torch.empty((), dtype=dtype).element_size()
            t = torch.frombuffer(data, dtype=dtype, count=count, offset=begin)
            t = t.reshape(info["shape"])
        else:
            t = torch.empty(info["shape"], dtype=dtype)
        if not torch.equal(t, formula(*expected[name])):
            fail(f"{name}: values differ from the formula: {t}")
    if covered != len(data):
        fail(f"tensors cover {covered} of {len(data)} data bytes")
    print(f"ok {len(header)} tensors")


def load_file(path):
    """{name: tensor}, the way safetensors.torch.load_file returns it."""
    blob = bytearray(open(path, "rb").read())
    (n,) = struct.unpack("<Q", bytes(blob[:8]))
    header = json.loads(bytes(blob[8:8 + n]).decode("utf-8"))
    meta = header.pop("__metadata__", {})
    data = blob[8 + n:]
    out = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        dtype = DTYPES[info["dtype"]]
        if end > begin:
            count = (end - begin) // torch.empty((), dtype=dtype).element_size()
            t = torch.frombuffer(data, dtype=dtype, count=count, offset=begin)
            out[name] = t.reshape(info["shape"]).clone()
        else:
            out[name] = torch.empty(info["shape"], dtype=dtype)
    return out, meta


def load(path):
    tensors, meta = load_file(path)
    crcs = json.loads(meta.get("tandem.crc32c", "{}"))
    elements = 0
    for name, t in tensors.items():
        raw = t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        if crcs.get(name) != "%08x" % crc32c(raw):
            fail(f"{name}: loaded bytes have checksum {crc32c(raw):08x}, the writer's {crcs.get(name)}")
        elements += t.numel()
    # The safetensors package itself, when installed (scripts/setup.sh puts it in .venv/).
    package = ""
    try:
        import safetensors
        import safetensors.torch
    except ImportError:
        safetensors = None
    if safetensors is not None:
        real = safetensors.torch.load_file(path)
        if sorted(real) != sorted(tensors):
            fail(f"safetensors.torch.load_file sees {sorted(real)}, this parser {sorted(tensors)}")
        for name, t in tensors.items():
            if real[name].dtype != t.dtype or not torch.equal(real[name], t):
                fail(f"{name}: safetensors.torch.load_file gives other values")
        package = f"; safetensors {safetensors.__version__} load_file agrees"
    print(f"ok {len(tensors)} tensors, {elements} elements identical to what tandem wrote{package}")


class Head(torch.nn.Module):
    def __init__(self, weight):
        super().__init__()
        self.weight = weight

    def forward(self, x):
        return torch.nn.functional.linear(x, self.weight)


class TiedNet(torch.nn.Module):
    """TiedNet of tests/checkpoint/test_module_weights.cpp, name for name."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(11, 5)
        self.fc = torch.nn.Linear(5, 5)
        self.norm = torch.nn.BatchNorm1d(5)
        self.head = Head(self.embed.weight)

    def forward(self, tokens):
        return self.head(self.norm(torch.relu(self.fc(self.embed(tokens)))))


def model(path, expected_path):
    """Pretrained weights as a Python user saves them, and what they compute."""
    from safetensors.torch import save_file, save_model
    torch.manual_seed(5)
    net = TiedNet()
    with torch.no_grad():
        net.norm.running_mean.uniform_(-1, 1)
        net.norm.running_var.uniform_(0.5, 2)
        net.norm.num_batches_tracked.fill_(3)
    net.eval()
    save_model(net, path, metadata={"writer": "safetensors.torch.save_model"})
    tokens = torch.tensor([1, 4, 9, 10, 0])
    with torch.no_grad():
        save_file({"tokens": tokens, "logits": net(tokens)}, expected_path)
    print(f"ok wrote {len(net.state_dict())} names with save_model")


def resave(src, dst):
    """load_file then save_file with the safetensors package: a Python round trip."""
    from safetensors.torch import load_file as real_load, save_file
    tensors = real_load(src)
    save_file(tensors, dst, metadata={"writer": "safetensors"})
    print(f"ok resaved {len(tensors)} tensors")


def bits(t):
    """The tensor's bytes, as a flat uint8 tensor."""
    return t.contiguous().reshape(-1).view(torch.uint8)


def package_save(path):
    """The formula tensors, written by safetensors.torch.save_file."""
    from safetensors.torch import save_file
    save_file({name: formula(dtype, shape) for name, dtype, shape in SPECS}, path,
              metadata={"writer": "safetensors.torch.save_file"})
    print(f"ok saved {len(SPECS)} tensors with save_file")


def package_check(path):
    """safetensors.torch.load_file gives every formula tensor: dtype, shape and bits."""
    from safetensors.torch import load_file as real_load
    tensors = real_load(path)
    if sorted(tensors) != sorted(name for name, _, _ in SPECS):
        fail(f"load_file sees {sorted(tensors)}")
    for name, dtype, shape in SPECS:
        t = tensors[name]
        if t.dtype != dtype or list(t.shape) != shape:
            fail(f"{name}: load_file gives {t.dtype} {list(t.shape)}, expected {dtype} {shape}")
        if not torch.equal(bits(t), bits(formula(dtype, shape))):
            fail(f"{name}: load_file gives other bits: {bits(t).tolist()}")
    print(f"ok load_file reads {len(tensors)} tensors, bit for bit")


def write(path):
    # Reverse order, so the data order differs from tandem's.
    tensors = [(name, formula(dtype, shape)) for name, dtype, shape in reversed(SPECS)]
    header = {"__metadata__": {"writer": "python"}}
    chunks = []
    offset = 0
    for name, t in tensors:
        raw = bytes(t.reshape(-1).view(torch.uint8).numpy().tobytes()) if t.numel() else b""
        header[name] = {"dtype": NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * ((8 - (8 + len(text)) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(chunks))
    print(f"ok wrote {len(tensors)} tensors")


if __name__ == "__main__":
    commands = {"check": (check, 1), "write": (write, 1), "load": (load, 1), "model": (model, 2),
                "resave": (resave, 2), "save_file": (package_save, 1),
                "load_file": (package_check, 1)}
    if len(sys.argv) < 2 or sys.argv[1] not in commands or len(sys.argv) != 2 + commands[sys.argv[1]][1]:
        print(__doc__)
        sys.exit(2)
    commands[sys.argv[1]][0](*sys.argv[2:])
