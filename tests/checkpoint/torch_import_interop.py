"""torch.save files for tandem's `checkpoint import` tests, made by the real
torch in the peer Python, and the check of what tandem wrote from them.

  write DIR          state_dict.pt, mixed.pt (views, bf16, shared storage,
                     ints, numbers, strings, bytes, torch.Size, a set) and
                     hostile.pt (a pickle that would run os.system on load)
  check SRC OUT      OUT (safetensors) holds every tensor of SRC under its
                     dotted path, bit for bit, and its other values as JSON
"""
import json
import os
import sys

import torch


def write(directory):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    state = model.state_dict()
    torch.save(state, os.path.join(directory, "state_dict.pt"))
    mixed = {
        "model": state, "step": 7, "lr": 0.5, "name": "run", "flag": True, "none": None,
        "view": torch.arange(10.0)[2:8:2],
        "bf16": torch.ones(2, 3, dtype=torch.bfloat16) / 3,
        "shared": [state["0.weight"], state["0.weight"].t()],
        "ints": torch.tensor([1, -2, 3]), "bytes": b"\x00\xffab", "size": torch.Size([2, 3]),
        "set": {1, 2}, "big_int": 2**40, "empty": torch.zeros(0, 3),
    }
    torch.save(mixed, os.path.join(directory, "mixed.pt"))

    class Hostile:
        def __reduce__(self):
            return (os.system, ("touch " + os.path.join(directory, "ran"),))

    torch.save({"w": torch.ones(2), "payload": Hostile()}, os.path.join(directory, "hostile.pt"))
    print("ok")


def flatten(value, name, out):
    if isinstance(value, dict):
        for key, item in value.items():
            flatten(item, f"{name}.{key}" if name else str(key), out)
    elif isinstance(value, (list, tuple, set)):
        items = sorted(value) if isinstance(value, set) else value
        for i, item in enumerate(items):
            flatten(item, f"{name}.{i}" if name else str(i), out)
    else:
        out[name] = value


def check(source, output):
    from safetensors import safe_open
    expected = {}
    flatten(torch.load(source, weights_only=True), "", expected)
    tensors = {k: v for k, v in expected.items() if torch.is_tensor(v)}
    others = {k: v for k, v in expected.items() if not torch.is_tensor(v)}
    with safe_open(output, "pt") as f:
        if set(f.keys()) != set(tensors):
            sys.exit(f"tensor names differ: {sorted(set(f.keys()) ^ set(tensors))}")
        for key, want in tensors.items():
            got = f.get_tensor(key)
            if got.dtype != want.dtype or not torch.equal(got, want):
                sys.exit(f"{key}: {got} != {want}")
        values = json.loads(f.metadata().get("import.values", "{}"))
    for key, want in others.items():
        got = values.get(key, "<missing>")
        if isinstance(want, bytes):
            got = bytes(got["bytes"])
        if got != want:
            sys.exit(f"{key}: {got!r} != {want!r}")
    print(f"ok {len(tensors)} tensors {len(others)} values")


if __name__ == "__main__":
    if sys.argv[1] == "write":
        write(sys.argv[2])
    else:
        check(sys.argv[2], sys.argv[3])
