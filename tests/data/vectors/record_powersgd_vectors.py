#!/usr/bin/env python3
"""Records PyTorch's PowerSGD hook on fixed gradients as test vectors.

tests/parallel/test_powersgd_hook.cpp checks tandem::PowerSGDHook against
powersgd.json: the same gradients on the same ranks must give the same
reduced buckets and the same error feedback on every rank.

How the vectors are made: for each case and world size (2 and 3), that many
processes join a Gloo group (a FileStore in a temporary directory) and each
calls torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook directly on
two buckets per iteration for 5 iterations, with start_powerSGD_iter = 2
(iterations 0 and 1 plainly averaged, 2 to 4 compressed). A bucket is a small
stand-in for dist.GradBucket (which Python cannot construct): its buffer,
index, is_last() and per-parameter views of the buffer, which is all the
hook reads. Rank r's gradient for iteration i and bucket b is
torch.randn(numel, generator=torch.Generator().manual_seed(seed)) with
seed = 1000 * i + 10 * r + b, which the C++ test draws alike.

Recorded per compressed iteration and bucket: the reduced buffer (rank 0's;
every rank ends with the same) and each rank's error feedback
(state.error_dict). Plain iterations are the average, which the test checks
by itself.

Run with the pip torch in .venv/ (scripts/setup.sh), from any directory:
    .venv/bin/python tests/data/vectors/record_powersgd_vectors.py
It rewrites powersgd.json next to itself (about 200 KB).
"""

import json
import os
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import (PowerSGDState,
                                                                       powerSGD_hook)

HERE = os.path.dirname(os.path.abspath(__file__))
ITERATIONS = 5
START_ITER = 2

# Two buckets of parameter shapes. Bucket 0 repeats a shape (PyTorch lays
# out P and Q shape group by shape group) and holds a bias and a 3-D tensor
# (viewed as 4 x 6); bucket 1 a square matrix that compresses only at rank 1
# and a wide one.
BUCKETS = [
    [[8, 8], [5], [4, 2, 3], [8, 8]],
    [[5, 5], [3, 9], [3]],
]

CASES = [
    # Defaults but the start: rank 1, error feedback, warm start, rate 2.
    {"name": "rank1_warm_start_error_feedback", "matrix_approximation_rank": 1,
     "min_compression_rate": 2.0, "use_error_feedback": True, "warm_start": True},
    # A fresh random Q every iteration; rate 1 compresses every matrix.
    {"name": "rank2_no_warm_start", "matrix_approximation_rank": 2,
     "min_compression_rate": 1.0, "use_error_feedback": True, "warm_start": False},
    # Rank 3: Householder QR instead of Gram-Schmidt; no error feedback.
    {"name": "rank3_qr_no_error_feedback", "matrix_approximation_rank": 3,
     "min_compression_rate": 1.0, "use_error_feedback": False, "warm_start": True},
]


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


class FakeBucket:
    """What powerSGD_hook reads of a dist.GradBucket."""

    def __init__(self, index, count, buffer, shapes):
        self._index, self._count, self._buffer = index, count, buffer
        self._grads, offset = [], 0
        for shape in shapes:
            self._grads.append(buffer[offset:offset + numel(shape)].view(shape))
            offset += numel(shape)

    def buffer(self):
        return self._buffer

    def index(self):
        return self._index

    def is_last(self):
        return self._index == self._count - 1

    def gradients(self):
        return self._grads


def gradient(rank, iteration, bucket):
    seed = 1000 * iteration + 10 * rank + bucket
    size = sum(numel(s) for s in BUCKETS[bucket])
    return torch.randn(size, generator=torch.Generator().manual_seed(seed))


def rank_main(rank, world, store_path, case, out_path):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank,
                            world_size=world)
    state = PowerSGDState(process_group=None,
                          matrix_approximation_rank=case["matrix_approximation_rank"],
                          start_powerSGD_iter=START_ITER,
                          min_compression_rate=case["min_compression_rate"],
                          use_error_feedback=case["use_error_feedback"],
                          warm_start=case["warm_start"], random_seed=0)
    record = []
    for iteration in range(ITERATIONS):
        for b in range(len(BUCKETS)):
            buffer = gradient(rank, iteration, b)
            out = powerSGD_hook(state, FakeBucket(b, len(BUCKETS), buffer, BUCKETS[b])).wait()
            if iteration < START_ITER:
                continue
            error = state.error_dict[b].tolist() if case["use_error_feedback"] else []
            record.append({"iteration": iteration, "bucket": b, "reduced": out.tolist(),
                           "error": error})
    with open(out_path, "w") as f:
        json.dump(record, f)
    dist.barrier()
    dist.destroy_process_group()


def run_case(case, world):
    with tempfile.TemporaryDirectory() as tmp:
        outs = [os.path.join(tmp, f"rank{r}.json") for r in range(world)]
        store = os.path.join(tmp, "store")
        ctx = mp.get_context("spawn")
        procs = [ctx.Process(target=rank_main, args=(r, world, store, case, outs[r]))
                 for r in range(world)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
            if p.exitcode != 0:
                raise RuntimeError(f"{case['name']} world {world}: a rank exited {p.exitcode}")
        per_rank = []
        for path in outs:
            with open(path) as f:
                per_rank.append(json.load(f))
    steps = []
    for k, entry in enumerate(per_rank[0]):
        for r in range(1, world):
            if per_rank[r][k]["reduced"] != entry["reduced"]:
                raise RuntimeError("ranks disagree on a reduced bucket")
        steps.append({"iteration": entry["iteration"], "bucket": entry["bucket"],
                      "reduced": entry["reduced"],
                      "error": [per_rank[r][k]["error"] for r in range(world)]})
    return {**case, "world": world, "steps": steps}


def compact(value):
    """JSON floats with float32's 9 significant digits."""
    if isinstance(value, float):
        return float(f"{value:.9g}")
    if isinstance(value, list):
        return [compact(v) for v in value]
    if isinstance(value, dict):
        return {k: compact(v) for k, v in value.items()}
    return value


def main():
    results = [run_case(case, world) for case in CASES for world in (2, 3)]
    doc = {"torch_version": torch.__version__, "start_powerSGD_iter": START_ITER,
           "iterations": ITERATIONS, "buckets": BUCKETS, "random_seed": 0,
           # Rank 2's gradient for iteration 3, bucket 1: the C++ test draws
           # its gradients alike and checks that it got this one.
           "sample_gradient": compact(gradient(2, 3, 1).tolist()),
           "cases": compact(results)}
    path = os.path.join(HERE, "powersgd.json")
    with open(path, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {path}: {len(results)} cases")


if __name__ == "__main__":
    main()
