#!/usr/bin/env python3
"""Records which samples HF Accelerate's prepared data loaders give each rank.

tests/data/test_accelerate_sharding.cpp checks tandem's prepared loaders
with split_batches / dispatch_batches (DistributedLoaderOptions::Sharding
kBatches and kDispatched) against accelerate_shards.json, index for index.

How: for each world size (1, 2 and 3) that many processes join a Gloo group
(torch.multiprocessing, loopback) and initialise Accelerate's PartialState
on the CPU; each then runs accelerate.data_loader.prepare_data_loader over a
DataLoader of TensorDataset(arange(n)) (shuffle off; batch_size per process,
or the global batch with split_batches, as Accelerate reads it) for every
case, and records the sample indices of each batch it yields. The
dispatching cases run Accelerate's DataLoaderDispatcher for real: process 0
draws the batches and broadcasts them.

Worlds 1, 2 and 3 (at 1 Accelerate shards nothing: the plain loader).
Cases: n in {1, 5, 7, 10, 13, 24}, per-process batch in {1, 2, 3, 4},
split_batches, dispatch_batches, drop_last and even_batches each on and off.
A case where Accelerate itself fails (its dispatcher over a loader with no
batch at all) is recorded with its "error" instead of "ranks".

Run with the pip torch and accelerate in .venv/ (scripts/setup.sh):
    .venv/bin/python tests/data/vectors/record_accelerate_shard_vectors.py
It rewrites accelerate_shards.json next to itself.
"""

import itertools
import json
import os
import socket
import tempfile

import torch
import torch.multiprocessing as mp

SIZES = [1, 5, 7, 10, 13, 24]
BATCHES = [1, 2, 3, 4]
FLAGS = list(itertools.product([False, True], repeat=4))  # split, dispatch, drop_last, even


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_rank(rank, world, port, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    from accelerate import PartialState
    from accelerate.data_loader import prepare_data_loader
    from torch.utils.data import DataLoader, TensorDataset

    PartialState(cpu=True, backend="gloo")
    records = []
    for n, bs, (split, dispatch, drop_last, even) in itertools.product(SIZES, BATCHES, FLAGS):
        loader = DataLoader(TensorDataset(torch.arange(n)), batch_size=bs * world if split else bs,
                            shuffle=False, drop_last=drop_last)
        prepared = prepare_data_loader(loader, device=torch.device("cpu"), num_processes=world,
                                       process_index=rank, split_batches=split,
                                       put_on_device=True, dispatch_batches=dispatch,
                                       even_batches=even)
        record = {"n": n, "batch_size": bs, "split_batches": split,
                  "dispatch_batches": dispatch, "drop_last": drop_last, "even_batches": even}
        try:
            record["batches"] = [batch[0].tolist() for batch in prepared]
        except (TypeError, ValueError) as error:
            # DataLoaderDispatcher fails on a loader with no batch at all
            # (drop_last with fewer samples than one join): recorded as such.
            record["batches"] = None
            record["error"] = f"{type(error).__name__}: {error}"[:200]
        records.append(record)
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(records, f)


def main():
    cases = []
    for world in (1, 2, 3):
        with tempfile.TemporaryDirectory() as out_dir:
            mp.spawn(run_rank, args=(world, free_port(), out_dir), nprocs=world, join=True)
            per_rank = []
            for rank in range(world):
                with open(os.path.join(out_dir, f"rank{rank}.json")) as f:
                    per_rank.append(json.load(f))
        for i, case in enumerate(per_rank[0]):
            entry = {k: v for k, v in case.items() if k != "batches"}
            entry["world"] = world
            ranks = [per_rank[r][i]["batches"] for r in range(world)]
            if None in ranks:
                entry["error"] = next(per_rank[r][i]["error"] for r in range(world)
                                      if per_rank[r][i]["batches"] is None)
            else:
                entry["ranks"] = ranks
            cases.append(entry)
    import accelerate
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "accelerate_shards.json")
    with open(path, "w") as f:
        json.dump({"accelerate": accelerate.__version__, "cases": cases}, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {len(cases)} cases to {path}")


if __name__ == "__main__":
    main()
