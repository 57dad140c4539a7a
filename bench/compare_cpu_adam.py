"""CPU Adam step, tandem's fused kernel against torch.optim.Adam (for-loop, foreach, fused) and DeepSpeedCPUAdam, in one run.

For each thread count, alternates the sides for --reps repetitions (who goes
first alternates too) and reports the median over repetitions. The tandem
side is build/bin/bench_cpu_adam, which also measures tandem::CpuAdam and
LibTorch's C++ torch::optim::Adam; the Python side (pip's torch in .venv/)
is torch.optim.Adam in its three implementations, foreach=False (for-loop),
foreach=True and fused=True, and DeepSpeed's DeepSpeedCPUAdam (adamw_mode
off) where deepspeed is installed: its C++ op is JIT-built on first use (about
70 s on this machine, cached in ~/.cache/torch_extensions), before anything
is timed; if it cannot be imported or built, the error's last line goes in
the JSON and the run goes on without it (--no-deepspeed skips it). Every
side steps one float32 tensor of --params elements with lr 1e-3, after
--warmup untimed steps; a figure is params / median step time.

    .venv/bin/python bench/compare_cpu_adam.py --build build --params 100000000 --threads 1,2

ratio = tandem Gparam/s / the fastest torch.optim.Adam's (> 1: tandem is
faster); ratio_vs_deepspeed = tandem / DeepSpeedCPUAdam. The last line is JSON.
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


# The Python-side optimizers: the JSON's name -> torch.optim.Adam's options,
# or None for DeepSpeedCPUAdam.
DEEPSPEED = "deepspeed_cpu_adam"
PYTHON_SIDES = {"foreach_false": {"foreach": False}, "foreach_true": {"foreach": True},
                "fused": {"fused": True}, DEEPSPEED: None}


def make_optimizer(variant, params):
    import torch
    options = PYTHON_SIDES[variant]
    if options is not None:
        return torch.optim.Adam(params, lr=1e-3, **options)
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from deepspeed.ops.adam import DeepSpeedCPUAdam
    return DeepSpeedCPUAdam(params, lr=1e-3, adamw_mode=False)


def torch_worker(args):
    """One Python measurement (run in its own process); prints a JSON line."""
    import torch
    torch.set_num_threads(args.threads)
    param = torch.randn(args.params).requires_grad_(True)
    param.grad = torch.randn(args.params) * 1e-2
    start = time.perf_counter()
    optimizer = make_optimizer(args.variant, [param])
    construct_s = time.perf_counter() - start  # DeepSpeedCPUAdam: its op's build, if not cached
    for _ in range(args.warmup):
        optimizer.step()
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        optimizer.step()
        times.append(time.perf_counter() - start)
    median = statistics.median(times)
    print(json.dumps({"gparams_per_s": args.params / median / 1e9, "step_ms": median * 1e3,
                      "threads": torch.get_num_threads(), "variant": args.variant,
                      "construct_s": construct_s, "torch": torch.__version__}))


def last_line(error):
    """The last non-blank line of a failed side's output, for the JSON."""
    lines = [line for line in str(error).splitlines() if line.strip()]
    return lines[-1] if lines else str(error)


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
    parser.add_argument("--no-deepspeed", action="store_true",
                        help="leave DeepSpeedCPUAdam out")
    parser.add_argument("--torch-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--variant", choices=list(PYTHON_SIDES), help=argparse.SUPPRESS)
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

    variants = [v for v in PYTHON_SIDES if not (args.no_deepspeed and v == DEEPSPEED)]
    deepspeed_error = None
    results = []
    for threads in [int(t) for t in args.threads.split(",") if t]:
        env_t = dict(env, OMP_NUM_THREADS=str(threads))
        sides = {"tandem": [program, "--threads", str(threads)] + common}
        for variant in variants:
            sides[variant] = [args.python, os.path.abspath(__file__), "--torch-worker",
                              "--threads", str(threads), "--variant", variant] + common
        order = list(sides)
        runs = {name: [] for name in sides}
        for rep in range(args.reps):
            for name in (order if rep % 2 == 0 else order[::-1]):
                if name == DEEPSPEED and deepspeed_error is not None:
                    continue
                try:
                    runs[name].append(run(sides[name], env_t, args.timeout))
                except RuntimeError as error:
                    if name != DEEPSPEED:
                        raise
                    # DeepSpeed is optional: note why it did not run, go on without it.
                    deepspeed_error = last_line(error)
                    print(f"{name} failed: {deepspeed_error}", file=sys.stderr, flush=True)
                    continue
                print(f"threads={threads} rep {rep + 1}/{args.reps} {name}: "
                      f"{runs[name][-1]['gparams_per_s']:.3f} Gparam/s", file=sys.stderr,
                      flush=True)

        def median(name, key="gparams_per_s"):
            return statistics.median(run[key] for run in runs[name]) if runs[name] else None

        python = {name: median(name) for name in variants if name != DEEPSPEED}
        python_best = max(python.values())
        deepspeed = median(DEEPSPEED) if DEEPSPEED in runs else None
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
            "deepspeed_cpu_adam_gparams_per_s": deepspeed,
            "ratio_vs_deepspeed": tandem / deepspeed if deepspeed else None,
        })

    def cell(value, width=8, digits=3):
        return f"{value:{width}.{digits}f}" if value is not None else f"{'-':>{width}}"

    print(f"Adam step on {args.params} float32 params, Gparam/s, median of {args.reps} reps "
          f"(each the median of {args.steps} steps); malloc tuning "
          f"{'off' if args.no_malloc_tuning else 'on'}")
    print(f"{'threads':>7} {'tandem':>8} {'CpuAdam':>8} {'C++ Adam':>8} {'py loop':>8} "
          f"{'py each':>8} {'py fused':>8} {'DS Adam':>8} {'ratio':>6} {'/DS':>6}")
    for r in results:
        py = r["python_gparams_per_s"]
        print(f"{r['threads']:7d} {r['tandem_gparams_per_s']:8.3f} "
              f"{r['cpu_adam_optimizer_gparams_per_s']:8.3f} {r['libtorch_gparams_per_s']:8.3f} "
              f"{cell(py['foreach_false'])} {cell(py['foreach_true'])} {cell(py['fused'])} "
              f"{cell(r['deepspeed_cpu_adam_gparams_per_s'])} {r['ratio']:6.2f} "
              f"{cell(r['ratio_vs_deepspeed'], 6, 2)}")
    print("py loop / each / fused: torch.optim.Adam with foreach=False / foreach=True / "
          "fused=True; DS Adam: DeepSpeedCPUAdam; ratio: tandem over the fastest "
          "torch.optim.Adam; /DS: tandem over DeepSpeedCPUAdam")
    print(json.dumps({"bench": "cpu_adam", "params": args.params, "steps": args.steps,
                      "warmup": args.warmup, "reps": args.reps,
                      "malloc_tuning": not args.no_malloc_tuning,
                      "deepspeed_error": deepspeed_error, "results": results}))


if __name__ == "__main__":
    main()
