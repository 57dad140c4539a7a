#!/usr/bin/env python3
"""Writes the seed corpus of fuzz_store_protocol (fuzz/corpus/store_protocol/).

Standard library only. Run from anywhere; rewrites the seeds in place:
  python3 fuzz/make_store_protocol_seeds.py
A seed is the target's script of steps, [control][length][bytes] (see
fuzz/fuzz_store_protocol.cpp); requests follow src/comm/store_protocol.h.
"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "corpus", "store_protocol")
MAGIC = b"TNDS"
HELLO, SET, GET, ADD, CAS, CHECK, WAIT, DELETE, NUMKEYS = range(1, 10)


def field(data):
    return struct.pack("<I", len(data)) + data


def frame(op, body=b""):
    return struct.pack("<IB", len(body) + 1, op) + body


def hello(token=b"fuzz-token", version=1):
    return MAGIC + frame(HELLO, struct.pack("<I", version) + field(token))


def i64(v):
    return struct.pack("<q", v)


def keys(*names):
    return struct.pack("<I", len(names)) + b"".join(field(n) for n in names)


def send(conn, data, authed=False):
    assert len(data) < 256
    return bytes([conn | (0x10 if authed else 0), len(data)]) + data


def tick(length):
    return bytes([2 << 2, length])


def reopen(conn):
    return bytes([conn | (3 << 2), 0])


SEEDS = {
    "set_get_add": send(0, frame(SET, field(b"k") + field(b"v")) + frame(GET, field(b"k") + i64(0))
                        + frame(ADD, field(b"n") + i64(5)) + frame(CHECK, keys(b"k", b"n"))
                        + frame(NUMKEYS) + frame(DELETE, field(b"k")), authed=True),
    "wait_then_set": send(0, frame(WAIT, keys(b"a", b"b") + i64(100)), authed=True)
                     + send(1, frame(SET, field(b"a") + field(b"1")), authed=True)
                     + send(1, frame(SET, field(b"b") + field(b"2"))),
    "get_timeout": send(0, frame(GET, field(b"x") + i64(50)), authed=True) + tick(10),
    "pipelined": send(0, frame(GET, field(b"k") + i64(0)) + frame(ADD, field(b"k") + i64(1)), authed=True)
                 + send(1, frame(SET, field(b"k") + field(b"41")), authed=True),
    "compare_set": send(2, frame(CAS, field(b"c") + field(b"") + field(b"v1"))
                        + frame(CAS, field(b"c") + field(b"v1") + field(b"v2")), authed=True),
    "bad_token": send(0, hello(b"wrong")),
    "bad_version": send(0, hello(version=7)),
    "good_hello_raw": send(3, hello()) + send(3, frame(NUMKEYS)),
    "huge_length": send(0, MAGIC + b"\xff\xff\xff\xff"),
    "huge_set": send(0, struct.pack("<I", 0x7fffffff) + bytes([SET]), authed=True),
    "handshake_timeout": send(0, MAGIC) + tick(255),
    "reopen_parked": send(0, frame(WAIT, keys(b"z") + i64(0)), authed=True) + reopen(0)
                     + send(1, frame(SET, field(b"z") + field(b"")), authed=True),
    "c10d_query": send(0, b"\x00\x00\x00\x00\x00\x00\x00\x01k"),
}


def main():
    os.makedirs(OUT, exist_ok=True)
    for name, blob in SEEDS.items():
        with open(os.path.join(OUT, name), "wb") as out:
            out.write(blob)
    print(f"wrote {len(SEEDS)} seeds to {OUT}")


if __name__ == "__main__":
    main()
