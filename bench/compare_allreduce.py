"""All-reduce bandwidth, tandem against torch.distributed (both Gloo, CPU), in one run.

Alternates the two for --reps repetitions (who goes first alternates too) and
reports, per size, the median over repetitions. tandem's ranks start through
`tandem launch`, PyTorch's under torchrun (pip torch 2.13 in .venv):

    .venv/bin/python bench/compare_allreduce.py --build build --sizes-mb 1,4,16,64,256

The last line is JSON; ratio = tandem busbw / torch busbw (>= 1.0: tandem is
at least as fast).
"""
import argparse
import json
import os
import statistics
import sys

from bench_common import (BENCH_DIR, add_common_args, last_json, run_launcher, run_ranks,
                          run_torch, tandem_paths)


def run_tandem(args, bench_args):
    launcher, program = tandem_paths(args, "bench_allreduce")
    if args.no_launcher:
        return last_json(run_ranks([program] + bench_args, args.nproc)[0])
    launch = [launcher, "launch", "--nproc-per-node", str(args.nproc), "--standalone",
              "--no-prefix", program]
    return last_json(run_launcher(launch + bench_args))


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
    parser.add_argument("--sizes-mb", default="1,4,16,64,256")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--nproc", type=int, default=2, help="ranks (one node)")
    args = parser.parse_args()
    tandem_paths(args, "bench_allreduce")
    bench_args = ["--sizes-mb", args.sizes_mb, "--iters", str(args.iters),
                  "--warmup", str(args.warmup)]

    runs = {"tandem": [], "torch": []}
    sides = [("tandem", run_tandem), ("torch", run_pytorch)]
    for rep in range(args.reps):
        for name, run in (sides if rep % 2 == 0 else sides[::-1]):
            runs[name].append(run(args, bench_args))
            print(f"rep {rep + 1}/{args.reps} {name} done", file=sys.stderr, flush=True)

    tandem, torch = summarise(runs["tandem"]), summarise(runs["torch"])
    print(f"all_reduce sum, float32, world {args.nproc}, median of {args.reps} reps "
          f"(each the median of {args.iters} iters)")
    print(f"{'MiB':>8} {'tandem ms':>10} {'torch ms':>10} {'tandem busbw':>13} "
          f"{'torch busbw':>12} {'ratio':>6}")
    results = []
    for mb in tandem:
        t, p = tandem[mb], torch[mb]
        ratio = t["busbw_gbps"] / p["busbw_gbps"]
        print(f"{mb:8g} {t['time_ms']:10.3f} {p['time_ms']:10.3f} {t['busbw_gbps']:10.3f} GB/s"
              f" {p['busbw_gbps']:9.3f} GB/s {ratio:6.3f}")
        results.append({"mb": mb, "tandem": t, "torch": p, "ratio": ratio})
    print(json.dumps({"bench": "allreduce", "world": args.nproc, "reps": args.reps,
                      "iters": args.iters, "launcher": not args.no_launcher,
                      "torchrun": not args.no_torchrun,
                      "results": results}))


if __name__ == "__main__":
    main()
