"""CPU Adam step, tandem's fused kernel against Python's torch.optim.Adam, in one run.

For each thread count, alternates the sides for --reps repetitions (who goes
first alternates too) and reports the median over repetitions. The tandem
side is build/bin/bench_cpu_adam, which also measures tandem::CpuAdam and
LibTorch's C++ torch::optim::Adam; the Python side is torch.optim.Adam on
Debian's torch 1.13, both foreach=False and foreach=True (the faster counts).
Every side steps one float32 tensor of --params elements with lr 1e-3, after
--warmup untimed steps; a figure is params / median step time.
Run with Debian's Python:

    .venv/bin/python bench/compare_cpu_adam.py --build build --params 100000000 --threads 1,2

ratio = tandem Gparam/s / the faster Python Gparam/s (> 1: tandem is faster).
The last line is JSON.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from bench_common import last_json, peer_python

# torch's Adam allocates param-sized temporaries every step (sqrt, division,
# the weight-decay add). glibc serves blocks that large with mmap and gives
# them back on free, and in this VM faulting 400 MB in again costs ~1 s, so
# untuned torch spends most of its step in page faults (tandem allocates
# nothing). Keeping every block in the heap shows torch at its best; both
# sides get the same environment. --no-malloc-tuning shows untuned figures.
MALLOC_TUNING = {"MALLOC_MMAP_MAX_": "0",  # never mmap: big blocks come from the heap
                 "MALLOC_TRIM_THRESHOLD_": str(16 << 30)}  # and stay there after free


def torch_worker(args):
    """One Python measurement (run in its own process); prints a JSON line."""
    import torch
    torch.set_num_threads(args.threads)
    param = torch.randn(args.params).requires_grad_(True)
    param.grad = torch.randn(args.params) * 1e-2
    optimizer = torch.optim.Adam([param], lr=1e-3, foreach=args.foreach)
    for _ in range(args.warmup):
        optimizer.step()
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        optimizer.step()
        times.append(time.perf_counter() - start)
    median = statistics.median(times)
    print(json.dumps({"gparams_per_s": args.params / median / 1e9, "step_ms": median * 1e3,
                      "threads": torch.get_num_threads(), "foreach": args.foreach,
                      "torch": torch.__version__}))


def run(cmd, env, timeout):
    out = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         timeout=timeout)
    text = out.stdout.decode(errors="replace")
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited with {out.returncode}:\n{text[-2000:]}")
    return last_json(text)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default="build",
                        help="tandem build directory (binaries in <build>/bin)")
    parser.add_argument("--python", default=peer_python(), help="Python with torch")
    parser.add_argument("--params", type=int, default=100_000_000)
    parser.add_argument("--threads", default="1,2", help="thread counts, comma-separated")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=600, help="seconds per run")
    parser.add_argument("--no-malloc-tuning", action="store_true",
                        help="leave glibc's malloc thresholds at their defaults")
    parser.add_argument("--torch-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--foreach", type=lambda s: s == "1", default=False,
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.torch_worker:
        args.threads = int(args.threads)
        return torch_worker(args)

    program = os.path.join(args.build, "bin", "bench_cpu_adam")
    if not os.access(program, os.X_OK):
        sys.exit(f"{program} not found: build it with "
                 f"`cmake --build {args.build} --target bench_cpu_adam`")
    env = dict(os.environ)
    if not args.no_malloc_tuning:
        env.update(MALLOC_TUNING)
    common = ["--params", str(args.params), "--steps", str(args.steps), "--warmup",
              str(args.warmup)]

    results = []
    for threads in [int(t) for t in args.threads.split(",") if t]:
        env_t = dict(env, OMP_NUM_THREADS=str(threads))
        sides = {
            "tandem": [program, "--threads", str(threads)] + common,
            "foreach0": [args.python, os.path.abspath(__file__), "--torch-worker", "--threads",
                         str(threads), "--foreach", "0"] + common,
            "foreach1": [args.python, os.path.abspath(__file__), "--torch-worker", "--threads",
                         str(threads), "--foreach", "1"] + common,
        }
        order = list(sides)
        runs = {name: [] for name in sides}
        for rep in range(args.reps):
            for name in (order if rep % 2 == 0 else order[::-1]):
                runs[name].append(run(sides[name], env_t, args.timeout))
                print(f"threads={threads} rep {rep + 1}/{args.reps} {name}: "
                      f"{runs[name][-1]['gparams_per_s']:.3f} Gparam/s", file=sys.stderr,
                      flush=True)

        def median(name, key="gparams_per_s"):
            return statistics.median(run[key] for run in runs[name])

        python = {"foreach_false": median("foreach0"), "foreach_true": median("foreach1")}
        python_best = max(python.values())
        tandem = median("tandem")
        results.append({
            "threads": threads,
            "isa": runs["tandem"][0]["isa"],
            "tandem_gparams_per_s": tandem,
            "tandem_runs": [run["gparams_per_s"] for run in runs["tandem"]],
            "cpu_adam_optimizer_gparams_per_s": median("tandem",
                                                       "cpu_adam_optimizer_gparams_per_s"),
            "libtorch_gparams_per_s": median("tandem", "torch_gparams_per_s"),
            "python_gparams_per_s": python,
            "python_best_gparams_per_s": python_best,
            "ratio": tandem / python_best,
        })

    print(f"Adam step on {args.params} float32 params, Gparam/s, median of {args.reps} reps "
          f"(each the median of {args.steps} steps); malloc tuning "
          f"{'off' if args.no_malloc_tuning else 'on'}")
    print(f"{'threads':>7} {'tandem':>8} {'CpuAdam':>8} {'C++ Adam':>8} {'py':>8} "
          f"{'py each':>8} {'ratio':>6}")
    for r in results:
        print(f"{r['threads']:7d} {r['tandem_gparams_per_s']:8.3f} "
              f"{r['cpu_adam_optimizer_gparams_per_s']:8.3f} {r['libtorch_gparams_per_s']:8.3f} "
              f"{r['python_gparams_per_s']['foreach_false']:8.3f} "
              f"{r['python_gparams_per_s']['foreach_true']:8.3f} {r['ratio']:6.2f}")
    print(json.dumps({"bench": "cpu_adam", "params": args.params, "steps": args.steps,
                      "warmup": args.warmup, "reps": args.reps,
                      "malloc_tuning": not args.no_malloc_tuning, "results": results}))


if __name__ == "__main__":
    main()
