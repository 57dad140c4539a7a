#!/usr/bin/env python3
"""safetensors interop check for tandem, with an independent parser.

There is no `safetensors` package here, so this script reads and writes the
format itself (json + torch.frombuffer), the way the reference implementation
lays files out, and checks tandem's CRC-32C with its own table code.

  safetensors_interop.py check FILE   FILE was written by tandem: check its layout,
                                      checksums and values (the test formula)
  safetensors_interop.py write FILE   write the formula tensors as a foreign
                                      writer would (no checksums, other order)
  safetensors_interop.py load FILE    load any tandem-written file into torch
                                      tensors (like safetensors.torch.load_file)
                                      and check each tensor's bytes, as loaded,
                                      against the CRC-32C the C++ writer recorded

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
}
NAMES = {v: k for k, v in DTYPES.items()}

# Same list as formula_specs() in safetensors_test_util.h.
SPECS = [
    ("f64", torch.float64, [2, 3]), ("f32", torch.float32, [4, 5, 6]),
    ("f16", torch.float16, [3, 8]), ("bf16", torch.bfloat16, [24]),
    ("i64", torch.int64, [5]), ("i32", torch.int32, [2, 2]), ("i16", torch.int16, [7]),
    ("i8", torch.int8, [9]), ("u8", torch.uint8, [10]), ("bool", torch.bool, [11]),
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
    elif dtype.is_floating_point:
        v = i * 0.25 - 3.0
    elif dtype is torch.uint8:
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
    print(f"ok {len(tensors)} tensors, {elements} elements identical to what tandem wrote")


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
    if len(sys.argv) != 3 or sys.argv[1] not in ("check", "write", "load"):
        print(__doc__)
        sys.exit(2)
    {"check": check, "write": write, "load": load}[sys.argv[1]](sys.argv[2])
