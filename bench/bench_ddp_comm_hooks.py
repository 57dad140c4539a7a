"""DDP step under each communication hook, PyTorch DDP (Gloo, CPU): the peer of bench_ddp_comm_hooks.cpp.

A rank program, measuring exactly as the C++ one does. Start it with RANK,
WORLD_SIZE, MASTER_ADDR and MASTER_PORT set (compare_ddp_comm_hooks.py does):

    .venv/bin/python bench/bench_ddp_comm_hooks.py --width 2048 --depth 3 --batch 32

Model: depth x (Linear(W, W) + ReLU), then Linear(W, 10); cross-entropy on a
fixed random batch per rank; SGD (lr 1e-3). Per hook (allreduce: DDP's
default; fp16: fp16_compress_hook; powersgd: powerSGD_hook with
start_powerSGD_iter 2 and PyTorch's other defaults), a fresh DDP-wrapped copy,
`warmup` untimed then `steps` timed steps with a barrier before each, a
step's time being the slowest rank's and the figure the median. Bytes per
step: the payload handed to all-reduce per rank and step (4 x parameters,
2 x for fp16, 4 x PowerSGDState's elements after compression over the timed
steps for PowerSGD). The last line is JSON.
"""
import argparse
import gc
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import (PowerSGDState,
                                                                       powerSGD_hook)
from torch.nn.parallel import DistributedDataParallel

CLASSES = 10


def make_model(width, depth):
    torch.manual_seed(0)
    layers = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    layers.append(nn.Linear(width, CLASSES))
    return nn.Sequential(*layers)


def time_hook(hook, inputs, labels, params, args):
    """(median slowest-rank step in ms, payload bytes per step) under `hook`."""
    if hook == "powersgd" and args.warmup < 2:
        raise SystemExit("--warmup must be at least 2, so that PowerSGD compresses in every "
                         "timed step")
    ddp = DistributedDataParallel(make_model(args.width, args.depth),
                                  bucket_cap_mb=args.bucket_mb)
    state = None
    if hook == "fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif hook == "powersgd":
        state = PowerSGDState(process_group=None, matrix_approximation_rank=args.rank,
                              start_powerSGD_iter=2)
        ddp.register_comm_hook(state, powerSGD_hook)
    elif hook != "allreduce":
        raise SystemExit(f"unknown hook {hook!r}; use allreduce, fp16 or powersgd")
    optimizer = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    seconds = torch.zeros(args.steps, dtype=torch.float64)
    sent_before = 0
    for i in range(args.warmup + args.steps):
        if i == args.warmup and state is not None:
            sent_before = state.total_numel_after_compression
        dist.barrier()
        start = time.perf_counter()
        optimizer.zero_grad()
        loss = F.cross_entropy(ddp(inputs), labels)
        loss.backward()
        optimizer.step()
        if i >= args.warmup:
            seconds[i - args.warmup] = time.perf_counter() - start
    if not torch.isfinite(loss):
        raise RuntimeError(f"loss is {loss.item()}")
    dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
    step_ms = statistics.median(seconds.tolist()) * 1e3
    bytes_per_step = {"allreduce": 4.0, "fp16": 2.0}.get(hook, 0.0) * params
    if state is not None:
        bytes_per_step = 4.0 * (state.total_numel_after_compression - sent_before) / args.steps
    del ddp
    return step_ms, bytes_per_step


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--depth", type=int, default=3)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=20, help="timed steps per hook")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps per hook")
    parser.add_argument("--bucket-mb", type=float, default=100.0,
                        help="DDP bucket_cap_mb (given, it caps the first bucket too)")
    parser.add_argument("--rank", type=int, default=4, help="PowerSGD's matrix_approximation_rank")
    parser.add_argument("--hooks", default="allreduce,fp16,powersgd")
    args = parser.parse_args()

    torch.set_num_threads(1)  # one intra-op thread per rank, as on the tandem side
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    generator = torch.Generator().manual_seed(1000 + rank)
    inputs = torch.randn(args.batch, args.width, generator=generator)
    labels = torch.randint(0, CLASSES, (args.batch,), generator=generator)
    params = sum(p.numel() for p in make_model(args.width, args.depth).parameters())

    results = {}
    for hook in [h for h in args.hooks.split(",") if h]:
        step_ms, bytes_per_step = time_hook(hook, inputs, labels, params, args)
        results[hook] = {"step_ms": step_ms, "bytes_per_step": bytes_per_step}
    if rank == 0:
        print(json.dumps({"impl": "torch", "world": world, "params": params,
                          "width": args.width, "depth": args.depth, "batch": args.batch,
                          "steps": args.steps, "warmup": args.warmup,
                          "bucket_mb": args.bucket_mb, "rank": args.rank, "hooks": results}),
              flush=True)
    # Every DDP wrapper and its hook state gone before the group goes.
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()
    # Past this point the interpreter's teardown sometimes aborts in torch
    # ("terminate called without an active exception", 1 run in 4 here),
    # after the results are out: leave without it.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
