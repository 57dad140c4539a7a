"""DDP training step, tandem against PyTorch DDP (both CPU, Gloo on the torch side), in one run.

For each width, alternates the two for --reps repetitions (who goes first
alternates too) and reports the median over repetitions of each figure.
tandem's ranks start through `tandem launch`, PyTorch's under torchrun (pip
torch 2.13 in .venv):

    .venv/bin/python bench/compare_ddp.py --build build --widths 256,1024,2048 --reps 3

exposed = step_ms - compute_ms (communication not hidden behind compute);
ratio = tandem step_ms / torch step_ms (<= 1.0: tandem is at least as fast).
The last line is JSON.
"""
import argparse
import json
import os
import statistics
import sys

from bench_common import (BENCH_DIR, add_common_args, last_json, run_launcher, run_ranks,
                          run_torch, tandem_paths)

# Both sides allocate and free gradient-sized temporaries every step (Adam,
# autograd). glibc gives blocks past its trim/mmap thresholds back to the
# kernel, and in a VM re-faulting them can cost more than the step itself
# (10x at W=2048 here). Keeping them in the heap removes that noise from both
# sides alike; --no-malloc-tuning shows the untuned figures.
MALLOC_TUNING = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20),  # glibc's maximum
                 "MALLOC_TRIM_THRESHOLD_": str(4 << 30)}

FIGURES = ("step_ms", "compute_ms", "allreduce_ms")
PHASES = ("forward_ms", "backward_ms", "optimizer_ms")


def run_tandem(args, bench_args):
    launcher, program = tandem_paths(args, "bench_ddp")
    if args.no_launcher:
        return last_json(run_ranks([program] + bench_args, args.nproc, args.timeout)[0])
    launch = [launcher, "launch", "--nproc-per-node", str(args.nproc), "--standalone",
              "--no-prefix", program]
    return last_json(run_launcher(launch + bench_args, args.timeout))


def run_pytorch(args, bench_args):
    script = os.path.join(BENCH_DIR, "bench_ddp.py")
    return last_json(run_torch(args, [script] + bench_args, args.nproc, args.timeout)[0])


def summarise(runs):
    """Median over repetitions of each figure of one side, plus every run's step_ms."""
    out = {key: statistics.median(run[key] for run in runs) for key in FIGURES}
    out["exposed_ms"] = out["step_ms"] - out["compute_ms"]
    for phase in ("ddp", "compute"):
        out[phase] = {key: statistics.median(run[phase][key] for run in runs) for key in PHASES}
    out["step_runs"] = [run["step_ms"] for run in runs]
    out["params"] = runs[0]["params"]
    return out


def default_steps(width):
    # The W=2048 step is a few hundred ms; fewer steps keep a run short.
    return 20 if width >= 2048 else 30


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(parser)
    parser.add_argument("--widths", default="256,1024,2048")
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int,
                        help="timed steps per phase (default 30, 20 for W >= 2048)")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--bucket-mb", type=float, default=25.0)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--nproc", type=int, default=2, help="ranks (one node)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per run")
    parser.add_argument("--no-malloc-tuning", action="store_true",
                        help="leave glibc's malloc thresholds at their defaults")
    args = parser.parse_args()
    tandem_paths(args, "bench_ddp")
    if not args.no_malloc_tuning:
        os.environ.update(MALLOC_TUNING)
    widths = [int(w) for w in args.widths.split(",") if w]

    results = []
    sides = [("tandem", run_tandem), ("torch", run_pytorch)]
    for width in widths:
        steps = args.steps or default_steps(width)
        bench_args = ["--width", str(width), "--depth", str(args.depth), "--batch",
                      str(args.batch), "--steps", str(steps), "--warmup", str(args.warmup),
                      "--bucket-mb", str(args.bucket_mb)]
        runs = {"tandem": [], "torch": []}
        for rep in range(args.reps):
            for name, run in (sides if rep % 2 == 0 else sides[::-1]):
                runs[name].append(run(args, bench_args))
                print(f"W={width} rep {rep + 1}/{args.reps} {name} done", file=sys.stderr,
                      flush=True)
        tandem, torch = summarise(runs["tandem"]), summarise(runs["torch"])
        results.append({"width": width, "steps": steps, "params": tandem["params"],
                        "tandem": tandem, "torch": torch,
                        "ratio": tandem["step_ms"] / torch["step_ms"]})

    print(f"DDP step, MLP depth {args.depth}, batch {args.batch}/rank, Adam, world "
          f"{args.nproc}, bucket {args.bucket_mb:g} MB, median of {args.reps} reps (each the "
          f"median of its steps); allreduce = one flat tensor of all gradients, averaged")
    print(f"{'W':>5} {'params':>9} {'impl':>6} {'step ms':>9} {'compute':>9} {'exposed':>9} "
          f"{'allreduce':>9} {'ratio':>6}")
    for r in results:
        for name in ("tandem", "torch"):
            s = r[name]
            ratio = f"{r['ratio']:6.3f}" if name == "tandem" else ""
            print(f"{r['width']:5d} {r['params']:9d} {name:>6} {s['step_ms']:9.2f} "
                  f"{s['compute_ms']:9.2f} {s['exposed_ms']:9.2f} {s['allreduce_ms']:9.2f} "
                  f"{ratio}")
    print(json.dumps({"bench": "ddp", "world": args.nproc, "reps": args.reps,
                      "depth": args.depth, "batch": args.batch, "warmup": args.warmup,
                      "bucket_mb": args.bucket_mb, "allreduce": "flat",
                      "launcher": not args.no_launcher, "torchrun": not args.no_torchrun,
                      "malloc_tuning": not args.no_malloc_tuning, "results": results}))


if __name__ == "__main__":
    main()
