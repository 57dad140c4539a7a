"""Time to 98% exact-match accuracy on held-out 3-digit sums: the tandem demo
on 2 CPU ranks (`tandem launch`) against the same model and recipe in Python
PyTorch 2.13 (bench/gpt_addition.py) on 2 ranks under torchrun (DDP, Gloo) and
under `accelerate launch` with Accelerate's `Accelerator`, and optionally as one
process (`single`); the sides take turns going first, one run per seed each.

    .venv/bin/python bench/compare_gpt_addition.py --build build --seeds 0,1,2

All evaluate every --eval-every steps; evaluation time is not training time.
The Python sides stop once they reach the target (their final accuracy is then
the accuracy at that point); tandem runs its full default schedule.
Prints a table, then one JSON line.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from bench_common import BENCH_DIR, last_json, peer_python

SIDES = ("tandem", "torchrun", "accelerate", "single")


def first_at(rows, target):
    for r in rows:
        if "accuracy" in r and r["accuracy"] >= target:
            return r["step"], r["train_s"]
    return None, None


def run_tandem(build, seed, eval_every, target):
    with tempfile.TemporaryDirectory() as tmp:
        metrics = os.path.join(tmp, "metrics.jsonl")
        cmd = [os.path.join(build, "bin", "tandem"), "launch", "--standalone", "--nproc-per-node",
               "2", os.path.join(build, "bin", "gpt_addition"), "--seed", str(seed),
               "--eval-every", str(eval_every), "--metrics-file", metrics]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        final = last_json(out)
        rows = [json.loads(line) for line in open(metrics)]
    step, seconds = first_at(rows, target)
    train_s = max(r["train_s"] for r in rows)
    return {"to_target_s": seconds, "to_target_step": step, "final_accuracy": final["accuracy"],
            "ms_per_step": 1000 * train_s / final["step"], "tokens_per_s": final["tokens_per_s"]}


def python_command(side, python, threads):
    """How a Python user starts the peer on `side`."""
    script = os.path.join(BENCH_DIR, "gpt_addition.py")
    if side == "torchrun":
        return [python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                script]
    if side == "accelerate":
        accelerate = os.path.join(os.path.dirname(python), "accelerate")
        return [accelerate, "launch", "--multi_gpu", "--num_processes", "2", "--num_machines",
                "1", "--mixed_precision", "no", "--dynamo_backend", "no", script, "--accelerate"]
    return [python, script] + (["--threads", str(threads)] if threads else [])


def run_torch(side, python, seed, eval_every, target, threads):
    cmd = python_command(side, python, threads) + [
        "--seed", str(seed), "--eval-every", str(eval_every), "--target", str(target),
        "--stop-at-target"]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"{' '.join(cmd)} exited with {res.returncode}:\n{res.stderr[-3000:]}")
    final = last_json(res.stdout)
    rows = [json.loads(line) for line in res.stderr.splitlines() if line.startswith("{")]
    step, seconds = first_at(rows, target)
    return {"to_target_s": seconds, "to_target_step": step, "final_accuracy": final["accuracy"],
            "ms_per_step": 1000 * final["train_s"] / final["step"],
            "tokens_per_s": final["tokens_per_s"], "threads": final["threads"],
            "world": final["world"]}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default="build")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--target", type=float, default=0.98)
    p.add_argument("--sides", default="tandem,torchrun,accelerate",
                   help=f"comma-separated, from {', '.join(SIDES)}")
    p.add_argument("--python", default=peer_python(), help="Python with torch and accelerate")
    p.add_argument("--torch-threads", type=int, default=0,
                   help="threads of the single-process side (0: torch's default)")
    a = p.parse_args()
    sides = [side for side in a.sides.split(",") if side]
    unknown = [side for side in sides if side not in SIDES]
    if unknown:
        sys.exit(f"--sides: unknown {unknown}; choose from {', '.join(SIDES)}")
    results = []
    for i, seed in enumerate(int(s) for s in a.seeds.split(",")):
        order = sides[i % len(sides):] + sides[:i % len(sides)]  # each side leads in turn
        row = {"seed": seed}
        for side in order:
            row[side] = (run_tandem(a.build, seed, a.eval_every, a.target) if side == "tandem"
                         else run_torch(side, a.python, seed, a.eval_every, a.target,
                                        a.torch_threads))
        results.append(row)
        print(f"seed {seed}: " + " | ".join(
            f"{side} {row[side]['to_target_s']} s (step {row[side]['to_target_step']}, "
            f"{row[side]['ms_per_step']:.1f} ms/step, final {row[side]['final_accuracy']:.4f})"
            for side in sides), flush=True)

    def median(side, key):
        values = [r[side][key] for r in results if r[side][key] is not None]
        return statistics.median(values) if values else None

    summary = {side: {k: median(side, k) for k in ("to_target_s", "to_target_step", "ms_per_step",
                                                    "final_accuracy")}
               for side in sides}
    summary["reached"] = {side: sum(r[side]["to_target_s"] is not None for r in results)
                          for side in sides}
    summary["runs"] = len(results)
    summary["per_seed"] = results
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
