#!/usr/bin/env python3
"""Records PyTorch's DistributedSampler, randperm and DataLoader output as test vectors.

The C++ tests in tests/data/ check tandem::DistributedSampler and
tandem::DistributedLoader against these files, so a change in either side's
index order fails a test instead of silently changing which samples a rank sees.

Run with the pip torch in .venv/ (scripts/setup.sh), from any directory:
    .venv/bin/python tests/data/vectors/record_sampler_vectors.py
It rewrites distributed_sampler.json and distributed_loader.json next to itself.
"""

import itertools
import json
import os

import torch
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

HERE = os.path.dirname(os.path.abspath(__file__))

# Modulus of the randperm checksum: a Mersenne prime, so the C++ side can
# reduce with plain uint64 arithmetic.
CHECKSUM_MOD = 2**61 - 1


def sampler_case(n, replicas, shuffle, seed, epoch, drop_last):
    ranks = []
    for rank in range(replicas):
        sampler = DistributedSampler(range(n), num_replicas=replicas, rank=rank,
                                     shuffle=shuffle, seed=seed, drop_last=drop_last)
        sampler.set_epoch(epoch)
        ranks.append(list(sampler))
    return {"n": n, "replicas": replicas, "shuffle": shuffle, "seed": seed, "epoch": epoch,
            "drop_last": drop_last, "num_samples": sampler.num_samples,
            "total_size": sampler.total_size, "ranks": ranks}


def sampler_cases():
    sizes = [0, 1, 2, 3, 5, 7, 10, 17, 100, 1000]
    replicas = [1, 2, 3, 4, 8]
    cases = []
    # Shuffled: the full grid; seed and epoch both feed the permutation.
    for n, r, seed, epoch, drop in itertools.product(sizes, replicas, [0, 1234], [0, 1, 5],
                                                     [False, True]):
        cases.append(sampler_case(n, r, True, seed, epoch, drop))
    # Unshuffled: seed and epoch must not matter, so one pair besides (0, 0)
    # is enough to show it.
    for n, r, drop in itertools.product(sizes, replicas, [False, True]):
        cases.append(sampler_case(n, r, False, 0, 0, drop))
        cases.append(sampler_case(n, r, False, 1234, 5, drop))
    # Seed arithmetic edges: Python wraps seed + epoch into uint64, so a
    # negative epoch and a seed above 2**63 are both legal.
    for n, r, seed, epoch in [(17, 3, 0, -1), (100, 4, 2**63 + 12345, 0),
                              (100, 4, 2**63 + 12345, 3), (10, 2, 2**64 - 1, 0)]:
        for drop in [False, True]:
            cases.append(sampler_case(n, r, True, seed, epoch, drop))
    return cases


def randperm_cases():
    # Small n exhaustively, then sizes where a change of algorithm or of the
    # random draw (32- vs 64-bit) would show. Long permutations are stored as
    # head, tail and a position-weighted checksum to keep the file small.
    sizes = list(range(0, 41)) + [100, 1000, 4096, 65537, 1000003]
    cases = []
    for n, seed in itertools.product(sizes, [0, 1234, 2**64 - 1]):
        g = torch.Generator()
        g.manual_seed(seed)
        perm = torch.randperm(n, generator=g).tolist()
        checksum = sum((i + 1) * v for i, v in enumerate(perm)) % CHECKSUM_MOD
        cases.append({"n": n, "seed": seed, "head": perm[:16], "tail": perm[-16:] if n else [],
                      "checksum": checksum})
    return cases


def loader_cases():
    cases = []
    for n, r, b, shuffle, sampler_drop, drop in itertools.product(
            [0, 1, 7, 23, 100], [1, 3, 4], [1, 3, 8], [False, True], [False, True],
            [False, True]):
        data = torch.arange(n)
        ranks = []
        for rank in range(r):
            sampler = DistributedSampler(TensorDataset(data), num_replicas=r, rank=rank,
                                         shuffle=shuffle, seed=7, drop_last=sampler_drop)
            sampler.set_epoch(1)
            loader = DataLoader(TensorDataset(data), batch_size=b, sampler=sampler,
                                drop_last=drop)
            ranks.append([batch[0].tolist() for batch in loader])
        cases.append({"n": n, "replicas": r, "batch_size": b, "shuffle": shuffle, "seed": 7,
                      "epoch": 1, "sampler_drop_last": sampler_drop, "drop_last": drop,
                      "ranks": ranks})
    return cases


def write(name, payload):
    path = os.path.join(HERE, name)
    with open(path, "w") as f:
        # One case per line: small diffs when a case changes.
        f.write('{"torch_version": %s,\n' % json.dumps(torch.__version__))
        keys = [k for k in payload]
        for k_i, key in enumerate(keys):
            f.write('"%s": [\n' % key)
            rows = payload[key]
            for i, row in enumerate(rows):
                f.write(json.dumps(row, separators=(",", ":")))
                f.write(",\n" if i + 1 < len(rows) else "\n")
            f.write("]%s\n" % ("," if k_i + 1 < len(keys) else ""))
        f.write("}\n")
    print(f"{path}: {os.path.getsize(path)} bytes")


def main():
    write("distributed_sampler.json",
          {"sampler_cases": sampler_cases(), "randperm_cases": randperm_cases()})
    write("distributed_loader.json", {"loader_cases": loader_cases()})


if __name__ == "__main__":
    main()
