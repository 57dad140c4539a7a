#!/usr/bin/env python3
"""Writes the seed corpus of fuzz_safetensors_header (fuzz/corpus/safetensors_header/).

Standard library only. Run from anywhere; rewrites the seeds in place:
  python3 fuzz/make_safetensors_header_seeds.py
Valid seeds come in both shapes the target tries: a whole file, and
[u64 data size][header JSON]. tandem-style seeds carry "tandem.crc32c" with the
__header__ layout checksum computed as safetensors_layout_bytes() does.
"""
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "corpus", "safetensors_header")
SIZES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
         "U8": 1, "BOOL": 1, "U64": 8, "U32": 4, "U16": 2, "F8_E4M3": 1, "F8_E5M2": 1,
         "F8_E4M3FNUZ": 1, "F8_E5M2FNUZ": 1, "F8_E8M0": 1}


def crc32c(data):
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def u64(v):
    return struct.pack("<Q", v)


def layout_bytes(entries, metadata):
    """safetensors_layout_bytes() of src/checkpoint/safetensors_header.cpp."""
    out = u64(len(entries))
    for name, dtype, shape, begin, end in sorted(entries, key=lambda e: (e[3], e[4], e[0].encode())):
        for s in (name.encode(), dtype.encode()):
            out += u64(len(s)) + s
        out += u64(len(shape)) + b"".join(u64(d) for d in shape) + u64(begin) + u64(end)
    out += u64(len(metadata))
    for k, v in sorted((k.encode(), v.encode()) for k, v in metadata.items()):
        out += u64(len(k)) + k + u64(len(v)) + v
    return out


def pad(text):
    return text + b" " * ((8 - (8 + len(text)) % 8) % 8)


def make(tensors, metadata=None, tandem=True):
    """tensors: [(name, dtype, shape, data bytes)] in data order."""
    header, entries, data = {}, [], b""
    for name, dtype, shape, raw in tensors:
        entries.append((name, dtype, shape, len(data), len(data) + len(raw)))
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    meta = dict(metadata or {})
    if tandem:
        crcs = {"__header__": "%08x" % crc32c(layout_bytes(entries, metadata or {}))}
        for name, _, _, raw in tensors:
            crcs[name] = "%08x" % crc32c(raw)
        meta["tandem.crc32c"] = json.dumps(crcs, separators=(",", ":"))
    if meta:
        header = {"__metadata__": meta, **header}
    text = pad(json.dumps(header, separators=(",", ":")).encode())
    return u64(len(text)) + text + data, u64(len(data)) + text


def make_raw(header, data):
    text = pad(header)
    return u64(len(text)) + text + data


def main():
    os.makedirs(OUT, exist_ok=True)
    valid = {
        "tandem_small": make([("w", "F32", [2, 3], bytes(range(24))), ("b", "F16", [3], b"\1" * 6),
                              ("step", "I64", [], b"\7" + b"\0" * 7)], {"note": "x"}),
        "tandem_all_dtypes": make([(d.lower(), d, [2], b"\3" * (2 * s)) for d, s in SIZES.items()]),
        "tandem_empty_and_scalar": make([("e", "F32", [0, 3], b""), ("s", "BF16", [], b"\0\x3f")]),
        "foreign_no_checksums": make([("a", "U8", [4], b"abcd"), ("z", "BOOL", [1, 1], b"\1")],
                                     {"format": "pt"}, tandem=False),
        "foreign_no_metadata": make([("x", "I32", [1], b"\0\0\0\0")], tandem=False),
    }
    seeds = {}
    for name, (as_file, as_header) in valid.items():
        seeds[name + ".file"] = as_file
        seeds[name + ".header"] = as_header
    f = valid["tandem_small"][0]
    seeds.update({
        "truncated.file": f[:len(f) - 5],
        "pickle.file": b"\x80\x02\x8a\x0al\xfc\x9cF\xf9 j\xa8P\x19.",
        "zip.file": b"PK\x03\x04\x00\x00\x08\x08\x00\x00archive/data.pkl",
        "huge_length.file": u64(2**40) + b"{}",
        "duplicate_keys.file": make_raw(b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
                                        b'"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}', b"xy"),
        "overlap.file": make_raw(b'{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},'
                                 b'"b":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}}', b"xyz"),
        "unsupported_dtype.file": make_raw(b'{"a":{"dtype":"F4","shape":[2],"data_offsets":[0,1]}}', b"x"),
    })
    for name, blob in seeds.items():
        with open(os.path.join(OUT, name), "wb") as out:
            out.write(blob)
    print(f"wrote {len(seeds)} seeds to {OUT}")


if __name__ == "__main__":
    main()
