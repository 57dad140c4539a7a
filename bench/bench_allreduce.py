"""Collective bandwidth of torch.distributed (Gloo): the peer of bench_allreduce.cpp.

A rank program, measuring exactly as the C++ one does: all_reduce,
all_gather_into_tensor (--op all_gather), reduce_scatter_tensor
(--op reduce_scatter) or all_to_all_single (--op all_to_all), float32, sum.
Start it with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set
(compare_allreduce.py does):

    .venv/bin/python bench/bench_allreduce.py --op all_gather --sizes-mb 1,4,16 --iters 20
"""
import argparse
import json
import statistics
import time

import torch
import torch.distributed as dist

BYTES_PER_MB = 1024.0 * 1024.0


class Collective:
    """One collective on buffers made for it; the size is the whole buffer."""

    def __init__(self, op, numel):
        world = dist.get_world_size()
        numel -= numel % world  # the whole buffer splits evenly
        self.op, self.world = op, world
        self.whole = torch.ones(numel, dtype=torch.float32)
        self.part = torch.ones(numel // world, dtype=torch.float32)
        exchanges = op in ("all_to_all", "send_recv")
        self.received = torch.ones(numel, dtype=torch.float32) if exchanges else None

    def run(self):
        if self.op == "all_reduce":
            dist.all_reduce(self.whole)
        elif self.op == "all_gather":
            dist.all_gather_into_tensor(self.whole, self.part)
        elif self.op == "all_to_all":
            dist.all_to_all_single(self.received, self.whole)
        elif self.op == "send_recv":
            # A ring: send to the next rank, receive the previous one's.
            rank = dist.get_rank()
            receiving = dist.irecv(self.received, (rank + self.world - 1) % self.world)
            sending = dist.isend(self.whole, (rank + 1) % self.world)
            sending.wait()
            receiving.wait()
        else:
            dist.reduce_scatter_tensor(self.part, self.whole)

    def check_then_zero(self):
        """One checked call, so a broken collective cannot post a fast time;
        then zeros, which stay finite however many times they are summed."""
        self.part.fill_(dist.get_rank() + 1)
        if self.op in ("all_to_all", "send_recv"):
            self.whole.fill_(dist.get_rank() + 1)
        self.run()
        out = {"reduce_scatter": self.part, "all_to_all": self.received,
               "send_recv": self.received}.get(self.op, self.whole)
        # A sum of world ones, rank 0's part (first in the gathered or
        # exchanged buffer), or the previous rank's buffer.
        want = 1.0 if self.op in ("all_gather", "all_to_all") else float(self.world)
        if self.op == "send_recv":
            want = float((dist.get_rank() + self.world - 1) % self.world + 1)
        if out.numel() and out[0].item() != want:
            raise RuntimeError(f"{self.op} returned {out[0].item()}, expected {want}")
        self.whole.zero_()
        self.part.zero_()
        if self.received is not None:
            self.received.zero_()

    def bytes(self):
        return self.whole.numel() * 4


def time_collective(collective, iters, warmup):
    """Median over iterations of the slowest rank's time, in seconds."""
    collective.check_then_zero()
    for _ in range(warmup):
        collective.run()

    seconds = torch.zeros(iters, dtype=torch.float64)
    for i in range(iters):
        dist.barrier()
        start = time.perf_counter()
        collective.run()
        seconds[i] = time.perf_counter() - start
    dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
    return statistics.median(seconds.tolist())


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--op", default="all_reduce",
                        choices=["all_reduce", "all_gather", "reduce_scatter", "all_to_all",
                                 "send_recv"])
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
    ring_factor = (world - 1) / world if world > 1 else 0.0
    bus_factor = 2.0 * ring_factor if args.op == "all_reduce" else ring_factor
    if args.op == "send_recv":
        bus_factor = 1.0 if world > 1 else 0.0  # each rank's buffer moves once

    results = []
    for mb in sizes:
        collective = Collective(args.op, int(mb * BYTES_PER_MB / 4))
        seconds = time_collective(collective, args.iters, args.warmup)
        algbw = collective.bytes() / seconds / 1e9
        if rank == 0:
            print(f"{mb:10.2f} MiB {seconds * 1e3:10.3f} ms  algbw {algbw:7.3f} GB/s"
                  f"  busbw {algbw * bus_factor:7.3f} GB/s", flush=True)
        results.append({"mb": mb, "time_ms": seconds * 1e3, "algbw_gbps": algbw,
                        "busbw_gbps": algbw * bus_factor})
    if rank == 0:
        print(json.dumps({"impl": "torch", "op": args.op, "transport": "gloo", "world": world,
                          "results": results}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
