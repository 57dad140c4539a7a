"""All-reduce bandwidth of torch.distributed (Gloo): the peer of bench_allreduce.cpp.

A rank program, measuring exactly as the C++ one does. Start it with RANK,
WORLD_SIZE, MASTER_ADDR and MASTER_PORT set (compare_allreduce.py does):

    .venv/bin/python bench/bench_allreduce.py --sizes-mb 1,4,16 --iters 20 --warmup 5
"""
import argparse
import json
import statistics
import time

import torch
import torch.distributed as dist

BYTES_PER_MB = 1024.0 * 1024.0


def time_all_reduce(mb, iters, warmup):
    """Median over iterations of the slowest rank's time, in seconds."""
    numel = int(mb * BYTES_PER_MB / 4)
    tensor = torch.ones(numel, dtype=torch.float32)

    # One checked reduction, so a broken collective cannot post a fast time.
    dist.all_reduce(tensor)
    if numel and tensor[0].item() != dist.get_world_size():
        raise RuntimeError(f"all_reduce returned {tensor[0].item()}")
    tensor.zero_()  # zeros stay finite however many times they are summed

    for _ in range(warmup):
        dist.all_reduce(tensor)

    seconds = torch.zeros(iters, dtype=torch.float64)
    for i in range(iters):
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(tensor)
        seconds[i] = time.perf_counter() - start
    dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
    return statistics.median(seconds.tolist())


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mb", default="1,4,16,64,256",
                        help="message sizes in MiB, comma separated")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args()
    sizes = [float(s) for s in args.sizes_mb.split(",") if s]

    # Gloo's reduction runs on the calling thread; keep ATen from competing.
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    bus_factor = 2.0 * (world - 1) / world if world > 1 else 0.0

    results = []
    for mb in sizes:
        seconds = time_all_reduce(mb, args.iters, args.warmup)
        algbw = mb * BYTES_PER_MB / seconds / 1e9
        if rank == 0:
            print(f"{mb:10.2f} MiB {seconds * 1e3:10.3f} ms  algbw {algbw:7.3f} GB/s"
                  f"  busbw {algbw * bus_factor:7.3f} GB/s", flush=True)
        results.append({"mb": mb, "time_ms": seconds * 1e3, "algbw_gbps": algbw,
                        "busbw_gbps": algbw * bus_factor})
    if rank == 0:
        print(json.dumps({"impl": "torch", "world": world, "results": results}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
