"""Training step under PyTorch DDP (Gloo, CPU): the peer of bench_ddp.cpp.

A rank program, measuring exactly as the C++ one does. Start it with RANK,
WORLD_SIZE, MASTER_ADDR and MASTER_PORT set (compare_ddp.py does):

    .venv/bin/python bench/bench_ddp.py --width 256 --depth 4 --batch 32 --steps 30

Model: depth x (Linear(W, W) + ReLU), then Linear(W, 10); cross-entropy on a
fixed random batch; Adam (lr 1e-3). Three phases, each `warmup` untimed then
`steps` timed iterations with a barrier before each, an iteration's time
being the slowest rank's and the figure the median:
  compute   the step (zero_grad, forward, backward, optimizer step) on a plain
            model: no communication at all;
  allreduce one flat float32 tensor as large as all gradients, averaged
            (Gloo has no AVG: sum, then divide, as DDP does);
  ddp       the same step on a DDP-wrapped copy of the model.
The last line is JSON.
"""
import argparse
import json
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

CLASSES = 10


def make_model(width, depth):
    layers = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    layers.append(nn.Linear(width, CLASSES))
    return nn.Sequential(*layers)


def slowest_medians(seconds):
    """seconds: [iters, k] on this rank. Per column, the median over iterations
    of the slowest rank's time, in ms."""
    dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
    return [statistics.median(column) * 1e3 for column in seconds.t().tolist()]


def time_steps(model, inputs, labels, args):
    """Phases of a training step; returns medians (ms) of [step, forward,
    backward, optimizer]. zero_grad counts in the step only."""
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    seconds = torch.zeros(args.steps, 4, dtype=torch.float64)
    for i in range(args.warmup + args.steps):
        dist.barrier()
        t0 = time.perf_counter()
        optimizer.zero_grad()
        t1 = time.perf_counter()
        loss = F.cross_entropy(model(inputs), labels)
        t2 = time.perf_counter()
        loss.backward()
        t3 = time.perf_counter()
        optimizer.step()
        t4 = time.perf_counter()
        if i >= args.warmup:
            seconds[i - args.warmup] = torch.tensor([t4 - t0, t2 - t1, t3 - t2, t4 - t3],
                                                    dtype=torch.float64)
    if not torch.isfinite(loss):
        raise RuntimeError(f"loss is {loss.item()}")
    return slowest_medians(seconds)


def time_all_reduce(numel, args):
    """Median (ms) of averaging one flat tensor of `numel` floats."""
    world = dist.get_world_size()
    flat = torch.zeros(numel, dtype=torch.float32)  # zeros stay finite
    seconds = torch.zeros(args.steps, 1, dtype=torch.float64)
    for i in range(args.warmup + args.steps):
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(flat)
        flat.div_(world)
        if i >= args.warmup:
            seconds[i - args.warmup, 0] = time.perf_counter() - start
    return slowest_medians(seconds)[0]


def phase_dict(medians):
    return {key: value for key, value in
            zip(("step_ms", "forward_ms", "backward_ms", "optimizer_ms"), medians)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=30, help="timed steps per phase")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps per phase")
    parser.add_argument("--bucket-mb", type=float, default=25.0, help="DDP bucket_cap_mb")
    args = parser.parse_args()

    # One intra-op thread per rank, as on the tandem side.
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    # Each rank its own fixed batch (as data-parallel shards would be).
    generator = torch.Generator().manual_seed(1000 + rank)
    inputs = torch.randn(args.batch, args.width, generator=generator)
    labels = torch.randint(0, CLASSES, (args.batch,), generator=generator)

    torch.manual_seed(0)
    plain = make_model(args.width, args.depth)
    params = sum(p.numel() for p in plain.parameters())
    compute = time_steps(plain, inputs, labels, args)
    del plain

    allreduce_ms = time_all_reduce(params, args)

    torch.manual_seed(0)
    ddp = DistributedDataParallel(make_model(args.width, args.depth),
                                  bucket_cap_mb=args.bucket_mb)
    step = time_steps(ddp, inputs, labels, args)

    if rank == 0:
        result = {
            "impl": "torch", "world": world, "params": params,
            "width": args.width, "depth": args.depth, "batch": args.batch,
            "steps": args.steps, "warmup": args.warmup, "bucket_mb": args.bucket_mb,
            "step_ms": step[0], "compute_ms": compute[0], "allreduce_ms": allreduce_ms,
            "allreduce": "flat", "ddp": phase_dict(step), "compute": phase_dict(compute),
        }
        print(json.dumps(result), flush=True)
    # A rank that tears down while its peer still holds a live DDP reducer can
    # leave the peer hanging at exit: drop the wrapper, then leave together.
    del ddp
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
