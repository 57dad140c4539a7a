"""Spawn-to-ready latency, tandem against torch.distributed, in one run.

Latency is the time from just before the ranks are started to the moment the
last of them has joined the job and passed a barrier (its READY line). tandem
starts through `tandem launch --standalone`, PyTorch's through `torchrun
--standalone` (`python -m torch.distributed.run`, pip torch 2.13 in .venv),
launchers included on both sides; each rank calls init then a barrier.
`--no-launcher` / `--no-torchrun` start plain rank processes instead:

    .venv/bin/python bench/compare_spawn.py --build build

The last line is JSON; ratio = tandem_ms / torch_ms (< 1.0: tandem is ready
sooner).
"""
import argparse
import json
import os
import re
import statistics
import sys
import time

from bench_common import (BENCH_DIR, add_common_args, run_launcher, run_ranks, run_torch,
                          tandem_paths)


READY = re.compile(r"READY (\d+) (\d+)$", re.M)


def latest_ready_ns(outputs, nproc):
    """The latest `READY <rank> <ns>` time over all ranks."""
    # Searched, not matched: under torchrun every rank's stdout and stderr
    # share one stream, and a READY line can land after another rank's
    # half-written warning.
    ready = {int(rank): int(ns) for rank, ns in READY.findall("\n".join(outputs))}
    if sorted(ready) != list(range(nproc)):
        raise RuntimeError(f"READY from ranks {sorted(ready)}, expected 0..{nproc - 1}")
    return max(ready.values())


def time_tandem(args):
    launcher, program = tandem_paths(args, "bench_ready")
    launch = [launcher, "launch", "--nproc-per-node", str(args.nproc), "--standalone", program]
    t0 = time.time_ns()
    outputs = run_ranks([program], args.nproc) if args.no_launcher else [run_launcher(launch)]
    return (latest_ready_ns(outputs, args.nproc) - t0) / 1e6


def time_torch(args):
    script = os.path.join(BENCH_DIR, "bench_ready.py")
    t0 = time.time_ns()
    outputs = run_torch(args, [script], args.nproc)
    return (latest_ready_ns(outputs, args.nproc) - t0) / 1e6


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(parser)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--nproc", type=int, default=4, help="ranks (one node)")
    args = parser.parse_args()
    tandem_paths(args, "bench_ready")

    runs = {"tandem": [], "torch": []}
    sides = [("tandem", time_tandem), ("torch", time_torch)]
    for rep in range(args.reps):
        for name, measure in (sides if rep % 2 == 0 else sides[::-1]):
            runs[name].append(measure(args))
            print(f"rep {rep + 1}/{args.reps} {name}: {runs[name][-1]:.1f} ms",
                  file=sys.stderr, flush=True)

    tandem_ms, torch_ms = statistics.median(runs["tandem"]), statistics.median(runs["torch"])
    how = "direct" if args.no_launcher else "tandem launch --standalone"
    print(f"spawn to all {args.nproc} ranks ready, median of {args.reps} reps")
    print(f"  tandem ({how}): {tandem_ms:8.1f} ms   runs {[round(x, 1) for x in runs['tandem']]}")
    torch_how = "direct" if args.no_torchrun else "torchrun --standalone"
    print(f"  torch ({torch_how}): {torch_ms:8.1f} ms   "
          f"runs {[round(x, 1) for x in runs['torch']]}")
    print(f"  ratio tandem/torch: {tandem_ms / torch_ms:.3f}")
    print(json.dumps({"bench": "spawn", "nproc": args.nproc, "reps": args.reps,
                      "launcher": not args.no_launcher, "torchrun": not args.no_torchrun,
                      "tandem_ms": tandem_ms,
                      "torch_ms": torch_ms, "ratio": tandem_ms / torch_ms,
                      "tandem_runs": runs["tandem"], "torch_runs": runs["torch"]}))


if __name__ == "__main__":
    main()
