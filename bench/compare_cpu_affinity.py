"""`tandem launch` with and without Accelerate's enable_cpu_affinity: N local
workers each run build/bin/bench_cpu_adam (tandem's CPU Adam kernel, the
ZeRO-Offload update) with --threads = its share of the CPUs, at the same time.

Each repetition launches both configurations (who goes first alternates) and
takes the slowest worker's throughput (the step of a data-parallel job waits
for it). Reports the median over repetitions, and each side's CPU lists as the
workers saw them. The last line is JSON; ratio > 1: pinned is faster.

    .venv/bin/python bench/compare_cpu_affinity.py --build build --nproc 2 \
        --params 20000000 --reps 5
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile



def launch(build, nproc, config_text, bench_args):
    with tempfile.TemporaryDirectory() as home:
        config = os.path.join(home, "accelerate.yaml")
        with open(config, "w") as f:
            f.write(config_text)
        # Each worker prints its Cpus_allowed_list, then the benchmark's JSON.
        script = ("grep Cpus_allowed_list /proc/self/status; exec \"$0\" \"$@\"")
        argv = [os.path.join(build, "bin", "tandem"), "launch", "--master-port", "0",
                "--config-file", config, "--nproc-per-node", str(nproc),
                "/bin/sh", "-c", script, os.path.join(build, "bin", "bench_cpu_adam")]
        argv += bench_args
        env = dict(os.environ, HOME=home)
        for name in ("TANDEM_CONFIG_FILE", "XDG_CACHE_HOME", "HF_HOME"):
            env.pop(name, None)
        out = subprocess.run(argv, env=env, check=True, capture_output=True, text=True).stdout
    results, cpus = [], []
    for line in out.splitlines():
        text = line.split(": ", 1)[1] if line.startswith("[") and ": " in line else line
        text = text.strip()
        if text.startswith("{"):
            results.append(json.loads(text))
        elif text.startswith("Cpus_allowed_list"):
            cpus.append(text.split(":", 1)[1].strip())
    if len(results) != nproc:
        raise SystemExit(f"expected {nproc} JSON lines, got {len(results)}:\n{out}")
    return min(r["gparams_per_s"] for r in results), sorted(cpus)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--build", default="build")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--params", type=int, default=20_000_000)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    cpus = len(os.sched_getaffinity(0))
    threads = max(1, cpus // args.nproc)
    bench = ["--params", str(args.params), "--threads", str(threads), "--steps",
             str(args.steps), "--warmup", "2", "--no-torch"]
    base = ("compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_CPU\n"
            f"num_processes: {args.nproc}\nuse_cpu: true\n")
    sides = {"pinned": base + "enable_cpu_affinity: true\n", "unpinned": base}
    figures = {name: [] for name in sides}
    lists = {}
    for rep in range(args.reps):
        order = ["pinned", "unpinned"] if rep % 2 == 0 else ["unpinned", "pinned"]
        for name in order:
            gps, seen = launch(args.build, args.nproc, sides[name], bench)
            figures[name].append(gps)
            lists[name] = seen
            print(f"rep {rep} {name:8s} slowest worker {gps:.3f} Gparam/s  cpus {seen}",
                  file=sys.stderr)
    pinned = statistics.median(figures["pinned"])
    unpinned = statistics.median(figures["unpinned"])
    print(json.dumps({"nproc": args.nproc, "cpus": cpus, "threads_per_worker": threads,
                      "params": args.params, "reps": args.reps,
                      "pinned_gparams_per_s": pinned, "unpinned_gparams_per_s": unpinned,
                      "ratio": pinned / unpinned, "pinned_cpu_lists": lists["pinned"],
                      "unpinned_cpu_lists": lists["unpinned"],
                      "pinned_all": figures["pinned"], "unpinned_all": figures["unpinned"]}))


if __name__ == "__main__":
    main()
