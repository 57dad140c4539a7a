"""torch.save files for tandem's `checkpoint import` tests, made by the real
torch in the peer Python, and the check of what tandem wrote from them.

  write DIR          state_dict.pt, mixed.pt (views, bf16, shared storage,
                     ints, numbers, strings, bytes, torch.Size, a set) and
                     hostile.pt (a pickle that would run os.system on load)
  check SRC OUT [SRC OUT ...]
                     each OUT (safetensors) holds every tensor of its SRC under
                     its dotted path, bit for bit, and its other values as
                     JSON (one Python for all the pairs: each start imports
                     torch)
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
    plain = (dict, list, tuple, set, str, bytes, int, float, bool, type(None))
    if not isinstance(value, plain) and not torch.is_tensor(value) and hasattr(value, "__dict__"):
        # A DeepSpeed record (LossScaler, fragment_address): tandem reads its
        # state as a dict with __class__.
        cls = type(value)
        state = {"__class__": f"{cls.__module__}.{cls.__name__}", **vars(value)}
        flatten(state, name, out)
    elif isinstance(value, dict):
        for key, item in value.items():
            flatten(item, f"{name}.{key}" if name else str(key), out)
    elif isinstance(value, (list, tuple, set)):
        items = sorted(value) if isinstance(value, set) else value
        for i, item in enumerate(items):
            flatten(item, f"{name}.{i}" if name else str(i), out)
    else:
        out[name] = value


def same_bits(a, b):
    """Equal dtypes, shapes and bytes: a NaN (DeepSpeed's padding can hold
    one) equals itself, which torch.equal does not say."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    def raw(t):
        return t.detach().contiguous().reshape(-1).view(torch.uint8)
    return torch.equal(raw(a), raw(b))


def check(source, output):
    """None when OUT holds SRC; else what differs."""
    from safetensors import safe_open
    expected = {}
    # weights_only=False: the files are this script's own (DeepSpeed's
    # records need it); tandem's reader is what must not trust them.
    flatten(torch.load(source, weights_only=False), "", expected)
    tensors = {k: v for k, v in expected.items() if torch.is_tensor(v)}
    others = {k: v for k, v in expected.items() if not torch.is_tensor(v)}
    with safe_open(output, "pt") as f:
        if set(f.keys()) != set(tensors):
            return f"tensor names differ: {sorted(set(f.keys()) ^ set(tensors))}"
        for key, want in tensors.items():
            got = f.get_tensor(key)
            if not same_bits(got, want):
                return f"{key}: {got} != {want}"
        values = json.loads(f.metadata().get("import.values", "{}"))
    for key, want in others.items():
        got = values.get(key, "<missing>")
        if isinstance(want, bytes):
            got = bytes(got["bytes"])
        if got != want:
            return f"{key}: {got!r} != {want!r}"
    print(f"{os.path.basename(source)}: ok {len(tensors)} tensors {len(others)} values")
    return None


if __name__ == "__main__":
    if sys.argv[1] == "write":
        write(sys.argv[2])
    else:
        pairs = sys.argv[2:]
        failures = [f"{src}: {why}" for src, out in zip(pairs[::2], pairs[1::2])
                    if (why := check(src, out)) is not None]
        sys.exit("\n".join(failures) if failures else 0)
