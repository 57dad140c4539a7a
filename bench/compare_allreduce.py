"""Collective bandwidth, tandem against torch.distributed (Gloo, CPU), in one run.

--op all_reduce (default), all_gather (torch: all_gather_into_tensor),
reduce_scatter (torch: reduce_scatter_tensor), all_to_all (torch:
all_to_all_single, equal splits) or send_recv (a ring: each rank sends its
buffer to the next and receives the previous one's; torch: isend/irecv);
float32, sum. tandem uses
shared memory between ranks of one host; --tandem-gloo adds tandem forced
onto Gloo (`--no-shm`) as a third side. Alternates the sides for --reps
repetitions (who goes first rotates too) and reports, per size, the median
over repetitions. tandem's ranks start through `tandem launch`, PyTorch's
under torchrun (pip torch 2.13 in .venv):

    .venv/bin/python bench/compare_allreduce.py --build build --sizes-mb 1,4,16,64,256
    .venv/bin/python bench/compare_allreduce.py --op reduce_scatter --tandem-gloo --nproc 4

The last line is JSON; ratio = tandem busbw / torch busbw (>= 1.0: tandem is
at least as fast), ratio_gloo = tandem busbw / tandem-on-Gloo busbw.
"""
import argparse
import json
import os
import statistics
import sys

from bench_common import (BENCH_DIR, add_common_args, last_json, run_launcher, run_ranks,
                          run_torch, tandem_paths)


def run_tandem(args, bench_args):
    """tandem's side: its default transport (shared memory on one host)."""
    launcher, program = tandem_paths(args, "bench_allreduce")
    if args.no_launcher:
        return last_json(run_ranks([program] + bench_args, args.nproc)[0])
    launch = [launcher, "launch", "--nproc-per-node", str(args.nproc), "--standalone",
              "--no-prefix", program]
    return last_json(run_launcher(launch + bench_args))


def run_tandem_gloo(args, bench_args):
    return run_tandem(args, bench_args + ["--no-shm"])


def run_pytorch(args, bench_args):
    script = os.path.join(BENCH_DIR, "bench_allreduce.py")
    return last_json(run_torch(args, [script] + bench_args, args.nproc)[0])


def summarise(runs):
    """Per size: median time and busbw over the repetitions of one side."""
    sizes = [r["mb"] for r in runs[0]["results"]]
    out = {}
    for i, mb in enumerate(sizes):
        out[mb] = {key: statistics.median(run["results"][i][key] for run in runs)
                   for key in ("time_ms", "algbw_gbps", "busbw_gbps")}
        # Every repetition's figure, so a reader can judge the noise.
        out[mb]["busbw_runs"] = [run["results"][i]["busbw_gbps"] for run in runs]
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(parser)
    parser.add_argument("--op", default="all_reduce",
                        choices=["all_reduce", "all_gather", "reduce_scatter", "all_to_all",
                                 "send_recv"])
    parser.add_argument("--tandem-gloo", action="store_true",
                        help="also run tandem with --no-shm (Gloo only)")
    parser.add_argument("--sizes-mb", default="1,4,16,64,256")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--nproc", type=int, default=2, help="ranks (one node)")
    args = parser.parse_args()
    tandem_paths(args, "bench_allreduce")
    bench_args = ["--op", args.op, "--sizes-mb", args.sizes_mb, "--iters", str(args.iters),
                  "--warmup", str(args.warmup)]

    sides = [("tandem", run_tandem), ("torch", run_pytorch)]
    if args.tandem_gloo:
        sides.append(("tandem_gloo", run_tandem_gloo))
    runs = {name: [] for name, _ in sides}
    for rep in range(args.reps):
        shift = rep % len(sides)
        for name, run in sides[shift:] + sides[:shift]:
            runs[name].append(run(args, bench_args))
            print(f"rep {rep + 1}/{args.reps} {name} done", file=sys.stderr, flush=True)

    summary = {name: summarise(side_runs) for name, side_runs in runs.items()}
    tandem, torch, gloo = summary["tandem"], summary["torch"], summary.get("tandem_gloo")
    print(f"{args.op} sum, float32, world {args.nproc}, median of {args.reps} reps "
          f"(each the median of {args.iters} iters); busbw in GB/s")
    print(f"{'MiB':>8} {'tandem ms':>10} {'torch ms':>10} {'tandem busbw':>13} "
          f"{'torch busbw':>12} {'ratio':>6}" + (f" {'gloo busbw':>11} {'vs gloo':>8}" if gloo else ""))
    results = []
    for mb in tandem:
        t, p = tandem[mb], torch[mb]
        ratio = t["busbw_gbps"] / p["busbw_gbps"]
        line = (f"{mb:8g} {t['time_ms']:10.3f} {p['time_ms']:10.3f} {t['busbw_gbps']:13.3f}"
                f" {p['busbw_gbps']:12.3f} {ratio:6.3f}")
        result = {"mb": mb, "tandem": t, "torch": p, "ratio": ratio}
        if gloo:
            g = gloo[mb]
            result.update(tandem_gloo=g, ratio_gloo=t["busbw_gbps"] / g["busbw_gbps"])
            line += f" {g['busbw_gbps']:11.3f} {result['ratio_gloo']:8.3f}"
        print(line)
        results.append(result)
    print(json.dumps({"bench": "allreduce", "op": args.op, "world": args.nproc, "reps": args.reps,
                      "iters": args.iters, "launcher": not args.no_launcher,
                      "torchrun": not args.no_torchrun,
                      "results": results}))


if __name__ == "__main__":
    main()
