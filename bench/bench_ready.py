"""Spawn-to-ready probe for torch.distributed: the peer of bench_ready.cpp.

Joins the job (init_process_group("gloo"), env://), waits for every rank, and
prints `READY <rank> <unix_time_ns>`. compare_spawn.py starts its clock
before the interpreter, so interpreter start and `import torch` count, as
they do for a user.
"""
import sys
import time

import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    dist.barrier()
    # One write per line: under torchrun the ranks share one stream unbuffered,
    # and print() writes the text and its newline separately.
    sys.stdout.write(f"READY {dist.get_rank()} {time.time_ns()}\n")
    sys.stdout.flush()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
