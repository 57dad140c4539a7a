"""DDP communication hooks, tandem against PyTorch DDP (both CPU, Gloo on the torch side), in one run.

Each side measures its DDP step under plain all-reduce, fp16 compression and
PowerSGD (rank --rank, compressing from iteration 2) on a model of a few
large matrices, with the bytes each hook hands to all-reduce per step.
Alternates the two sides for --reps repetitions (who goes first alternates
too) and reports the median over repetitions. tandem's ranks start through
`tandem launch`, PyTorch's under torchrun (pip torch 2.13 in .venv):

    .venv/bin/python bench/compare_ddp_comm_hooks.py --build build --reps 3

vs allreduce = a hook's step time / the same side's all-reduce step time;
ratio = tandem step_ms / torch step_ms for the same hook. The last line is
JSON.

Buckets: every bucket at --bucket-mb on both sides (PyTorch 2.13's DDP caps
the first bucket at bucket_cap_mb when one is given), 100 MB by default: one
bucket for the default model. PyTorch's powerSGD_hook over Gloo issues its
second and third all-reduces from the callbacks of Gloo's two worker threads
and waits for them there; with several buckets in flight that hangs (25 MB
here: three buckets) or sends the ranks' collectives in different orders
(5 MB: "Received data size doesn't match expected size"). tandem runs a
hook's later steps in a fixed order and has neither problem; run
bench_ddp_comm_hooks by hand with --bucket-mb 25 to see it with several.
"""
import argparse
import json
import os
import statistics
import sys

from bench_common import (BENCH_DIR, add_common_args, last_json, run_launcher, run_ranks,
                          run_torch, tandem_paths)
from compare_ddp import MALLOC_TUNING

PROGRAM = "bench_ddp_comm_hooks"


def run_tandem(args, bench_args):
    launcher, program = tandem_paths(args, PROGRAM)
    if args.no_launcher:
        return last_json(run_ranks([program] + bench_args, args.nproc, args.timeout)[0])
    launch = [launcher, "launch", "--nproc-per-node", str(args.nproc), "--standalone",
              "--no-prefix", program]
    return last_json(run_launcher(launch + bench_args, args.timeout))


def run_pytorch(args, bench_args):
    script = os.path.join(BENCH_DIR, PROGRAM + ".py")
    return last_json(run_torch(args, [script] + bench_args, args.nproc, args.timeout)[0])


def summarise(runs, hooks):
    """Per hook, the median over repetitions of step_ms, every run's step_ms, and bytes."""
    out = {}
    for hook in hooks:
        steps = [run["hooks"][hook]["step_ms"] for run in runs]
        out[hook] = {"step_ms": statistics.median(steps), "step_runs": steps,
                     "bytes_per_step": statistics.median(
                         run["hooks"][hook]["bytes_per_step"] for run in runs)}
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(parser)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--depth", type=int, default=3)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--bucket-mb", type=float, default=100.0)
    parser.add_argument("--rank", type=int, default=4, help="PowerSGD's matrix_approximation_rank")
    parser.add_argument("--hooks", default="allreduce,fp16,powersgd")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--nproc", type=int, default=2, help="ranks (one node)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per run")
    parser.add_argument("--no-malloc-tuning", action="store_true",
                        help="leave glibc's malloc thresholds at their defaults")
    args = parser.parse_args()
    tandem_paths(args, PROGRAM)
    if not args.no_malloc_tuning:
        os.environ.update(MALLOC_TUNING)
    hooks = [h for h in args.hooks.split(",") if h]
    bench_args = ["--width", str(args.width), "--depth", str(args.depth), "--batch",
                  str(args.batch), "--steps", str(args.steps), "--warmup", str(args.warmup),
                  "--bucket-mb", str(args.bucket_mb), "--rank", str(args.rank),
                  "--hooks", ",".join(hooks)]

    runs = {"tandem": [], "torch": []}
    sides = [("tandem", run_tandem), ("torch", run_pytorch)]
    for rep in range(args.reps):
        for name, run in (sides if rep % 2 == 0 else sides[::-1]):
            runs[name].append(run(args, bench_args))
            print(f"rep {rep + 1}/{args.reps} {name} done", file=sys.stderr, flush=True)
    params = runs["tandem"][0]["params"]
    tandem, torch = summarise(runs["tandem"], hooks), summarise(runs["torch"], hooks)

    print(f"DDP step per hook, {args.depth} x Linear({args.width}, {args.width}) + "
          f"Linear({args.width}, 10) ({params} parameters), batch {args.batch}/rank, SGD, world "
          f"{args.nproc}, bucket {args.bucket_mb:g} MB, PowerSGD rank {args.rank}; median of "
          f"{args.reps} reps (each the median of {args.steps} steps)")
    print(f"{'hook':>10} {'impl':>6} {'step ms':>9} {'vs allreduce':>12} {'MB/step':>10} "
          f"{'ratio':>6}")
    results = []
    for hook in hooks:
        entry = {"hook": hook, "tandem": tandem[hook], "torch": torch[hook],
                 "ratio": tandem[hook]["step_ms"] / torch[hook]["step_ms"]}
        for name, side in (("tandem", tandem), ("torch", torch)):
            s = side[hook]
            if "allreduce" in side:
                s["vs_allreduce"] = s["step_ms"] / side["allreduce"]["step_ms"]
            vs = f"{s['vs_allreduce']:12.3f}" if "vs_allreduce" in s else f"{'':>12}"
            ratio = f"{entry['ratio']:6.3f}" if name == "tandem" else ""
            print(f"{hook:>10} {name:>6} {s['step_ms']:9.2f} {vs} "
                  f"{s['bytes_per_step'] / 1e6:10.3f} {ratio}")
        results.append(entry)
    print(json.dumps({"bench": "ddp_comm_hooks", "world": args.nproc, "reps": args.reps,
                      "params": params, "width": args.width, "depth": args.depth,
                      "batch": args.batch, "steps": args.steps, "warmup": args.warmup,
                      "bucket_mb": args.bucket_mb, "rank": args.rank,
                      "launcher": not args.no_launcher, "torchrun": not args.no_torchrun,
                      "malloc_tuning": not args.no_malloc_tuning, "results": results}))


if __name__ == "__main__":
    main()
