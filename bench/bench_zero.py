"""Training step and per-rank memory under PyTorch DDP, ZeroRedundancyOptimizer and FSDP2: the peer of bench_zero.cpp.

A rank program, measuring exactly as the C++ one does. Start it under
torchrun (compare_zero.py does):

    .venv/bin/python -m torch.distributed.run --standalone --nproc-per-node 2 \
        bench/bench_zero.py --stage 1 --width 2048 --depth 8 --batch 32 --steps 15

--stage 0: nn.parallel.DistributedDataParallel + torch.optim.Adam;
--stage 1: torch.distributed.optim.ZeroRedundancyOptimizer(Adam) over the same
           DDP model (PyTorch's ZeRO-1: optimizer state partitioned by
           parameter, each rank steps its own parameters and broadcasts them);
--stage 3: FSDP2, torch.distributed.fsdp.fully_shard on every Block, then on
           the whole model (PyTorch's ZeRO-3: parameters, gradients and Adam
           state sharded; parameters gathered per Block for forward and
           backward and freed after), + torch.optim.Adam.
All over Gloo, with PyTorch's default options otherwise.

Model: depth x Block, Block(x) = x + relu(fc(norm(x))) with fc = Linear(W, W)
and norm = LayerNorm(W), then Linear(W, 10); cross-entropy on a fixed random
batch per rank; Adam (lr 1e-3). `warmup` untimed then `steps` timed steps, a
barrier before each; a step's time is the slowest rank's, the figure the
median. Memory per rank, as in bench_zero.cpp: model_state_bytes (parameters,
their .grad, and the optimizer state this rank holds, after the last step;
DDP's own bucket buffers are not counted) against ZeRO's formula,
baseline/peak/loop-peak RSS from /proc/self/status, the loop peak measured
after malloc_trim(0) and a reset of VmHWM (/proc/self/clear_refs).
The last line is JSON.
"""
import argparse
import ctypes
import json
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel

CLASSES = 10
MEMORY_COLUMNS = ("model_state_bytes", "parameter_bytes", "gradient_bytes",
                  "optimizer_state_bytes", "baseline_rss_bytes", "peak_rss_bytes",
                  "setup_peak_rss_bytes", "loop_peak_rss_bytes", "end_rss_bytes")


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.norm = nn.LayerNorm(width)

    def forward(self, x):
        return x + torch.relu(self.fc(self.norm(x)))


class Stack(nn.Module):
    def __init__(self, width, depth):
        super().__init__()
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, CLASSES)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def formula_bytes(stage, psi, n):
    return {1: 4 * psi + 4 * psi + 8 * psi / n, 2: 4 * psi + 12 * psi / n,
            3: 16 * psi / n}.get(stage, 16 * psi)


def proc_status_bytes(field):
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return -1


def reset_peak_rss():
    try:
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")
        return True
    except OSError:
        return False


LIBC = ctypes.CDLL("libc.so.6")


def return_free_memory():
    """glibc's free heap back to the kernel (PyTorch's CPU allocator caches nothing)."""
    LIBC.malloc_trim(0)


def time_steps(model, optimizer, inputs, labels, args):
    """Returns medians (ms) of [step, forward, backward, optimizer] of the slowest rank."""
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
    dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
    return [statistics.median(column) * 1e3 for column in seconds.t().tolist()]


def local_bytes(t):
    """Bytes this rank holds of `t` (its own shard of an FSDP2 DTensor)."""
    t = t.to_local() if hasattr(t, "to_local") else t
    return t.numel() * t.element_size()


def state_bytes(state):
    return sum(local_bytes(t) for per_param in state.values()
               for t in per_param.values() if torch.is_tensor(t))


def fixed_batch(args, rank):
    """This rank's fixed batch (as data-parallel shards would be): inputs, labels."""
    generator = torch.Generator().manual_seed(1000 + rank)
    inputs = torch.randn(args.batch, args.width, generator=generator)
    return inputs, torch.randint(0, CLASSES, (args.batch,), generator=generator)


def start_rank(args, join):
    """One intra-op thread (as on the tandem side), `join()` the job, then this
    rank's bare RSS, its fixed batch and the model (seed 0):
    (rank, world, baseline_rss, inputs, labels, model)."""
    torch.set_num_threads(1)
    join()
    rank, world = dist.get_rank(), dist.get_world_size()
    return_free_memory()
    baseline_rss = proc_status_bytes("VmRSS")
    inputs, labels = fixed_batch(args, rank)
    torch.manual_seed(0)
    return rank, world, baseline_rss, inputs, labels, Stack(args.width, args.depth)


def memory_per_rank(mine, rank, world):
    """Every rank's MEMORY_COLUMNS, from each rank's own list `mine`."""
    rows = torch.zeros(world, len(MEMORY_COLUMNS), dtype=torch.float64)
    rows[rank] = torch.tensor(mine, dtype=torch.float64)
    dist.all_reduce(rows)
    return {name: [int(v) for v in rows[:, c].tolist()] for c, name in enumerate(MEMORY_COLUMNS)}


def result(args, impl, optimizer, offload, params, step, per_rank, peak_reset):
    """The JSON line compare_zero.py reads, for any impl."""
    world = len(per_rank["model_state_bytes"])
    return {
        "impl": impl, "stage": args.stage, "optimizer": optimizer,
        "world": world, "params": params, "width": args.width, "depth": args.depth,
        "batch": args.batch, "steps": args.steps, "warmup": args.warmup,
        "bucket_mb": args.bucket_mb, "offload": offload,
        "step_ms": step[0], "forward_ms": step[1], "backward_ms": step[2],
        "optimizer_ms": step[3],
        "model_state_bytes": max(per_rank["model_state_bytes"]),
        "formula_bytes": int(formula_bytes(args.stage, params, world)),
        "peak_rss_bytes": max(per_rank["peak_rss_bytes"]),
        "loop_peak_rss_bytes": max(per_rank["loop_peak_rss_bytes"]),
        "peak_reset": peak_reset, "per_rank": per_rank,
    }


OPTIMIZER_NAMES = {0: "ddp+torch.optim.Adam", 1: "ZeroRedundancyOptimizer(Adam)+ddp",
                   3: "fully_shard(FSDP2)+torch.optim.Adam"}


def wrap(model, stage, bucket_mb):
    """(model to train, optimizer, this rank's optimizer state) for `stage`."""
    if stage == 3:
        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        return model, optimizer, lambda: optimizer.state
    ddp = DistributedDataParallel(model, bucket_cap_mb=bucket_mb)
    if stage == 0:
        optimizer = torch.optim.Adam(ddp.parameters(), lr=1e-3)
        return ddp, optimizer, lambda: optimizer.state
    optimizer = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.Adam,
                                        lr=1e-3)
    return ddp, optimizer, lambda: optimizer.optim.state  # this rank's partition


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stage", type=int, choices=(0, 1, 3), default=1,
                        help="0: DDP + Adam; 1: ZeroRedundancyOptimizer(Adam) over DDP; "
                             "3: FSDP2 (fully_shard) + Adam")
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=15, help="timed steps")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps")
    parser.add_argument("--bucket-mb", type=float, default=25.0, help="DDP bucket_cap_mb")
    args = parser.parse_args()

    rank, world, baseline_rss, inputs, labels, model = start_rank(
        args, lambda: dist.init_process_group("gloo"))
    params = sum(p.numel() for p in model.parameters())
    trained, optimizer, local_state = wrap(model, args.stage, args.bucket_mb)

    dist.barrier()
    setup_peak_rss = proc_status_bytes("VmHWM")
    return_free_memory()
    peak_reset = reset_peak_rss()

    step = time_steps(trained, optimizer, inputs, labels, args)
    loop_peak_rss = proc_status_bytes("VmHWM")
    end_rss = proc_status_bytes("VmRSS")

    parameter_bytes = sum(local_bytes(p) for p in model.parameters())
    gradient_bytes = sum(local_bytes(p.grad) for p in model.parameters() if p.grad is not None)
    optimizer_bytes = state_bytes(local_state())
    mine = [parameter_bytes + gradient_bytes + optimizer_bytes, parameter_bytes, gradient_bytes,
            optimizer_bytes, baseline_rss, max(setup_peak_rss, loop_peak_rss), setup_peak_rss,
            loop_peak_rss, end_rss]
    per_rank = memory_per_rank(mine, rank, world)
    if rank == 0:
        print(json.dumps(result(args, "torch", OPTIMIZER_NAMES[args.stage], False, params, step,
                                per_rank, peak_reset)), flush=True)
    # A rank that tears down while its peer still holds a live DDP reducer can
    # leave the peer hanging at exit: drop the wrappers, then leave together.
    del optimizer, trained
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
