"""Time to 98% exact-match accuracy on held-out 3-digit sums: the tandem demo
on 2 CPU ranks against the same model and recipe as a plain single-process
PyTorch script (bench/gpt_addition.py), alternating, one run per seed each.

    .venv/bin/python bench/compare_gpt_addition.py --build build --seeds 0,1,2

Both evaluate every --eval-every steps; evaluation time is not training time.
The PyTorch side stops once it reaches the target (its final accuracy is then
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

from bench_common import BENCH_DIR, last_json


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


def run_torch(seed, eval_every, target, threads):
    cmd = [sys.executable, os.path.join(BENCH_DIR, "gpt_addition.py"), "--seed", str(seed),
           "--eval-every", str(eval_every), "--target", str(target), "--stop-at-target"]
    if threads:
        cmd += ["--threads", str(threads)]
    res = subprocess.run(cmd, capture_output=True, text=True, check=True)
    final = last_json(res.stdout)
    rows = [json.loads(line) for line in res.stderr.splitlines() if line.startswith("{")]
    step, seconds = first_at(rows, target)
    return {"to_target_s": seconds, "to_target_step": step, "final_accuracy": final["accuracy"],
            "ms_per_step": 1000 * final["train_s"] / final["step"],
            "tokens_per_s": final["tokens_per_s"], "threads": final["threads"]}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default="build")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--target", type=float, default=0.98)
    p.add_argument("--torch-threads", type=int, default=0, help="0: torch's default")
    a = p.parse_args()
    results = []
    for i, seed in enumerate(int(s) for s in a.seeds.split(",")):
        order = ["tandem", "torch"] if i % 2 == 0 else ["torch", "tandem"]
        row = {"seed": seed}
        for side in order:
            row[side] = (run_tandem(a.build, seed, a.eval_every, a.target) if side == "tandem"
                         else run_torch(seed, a.eval_every, a.target, a.torch_threads))
        results.append(row)
        t, q = row["tandem"], row["torch"]
        print(f"seed {seed}: tandem {t['to_target_s']} s (step {t['to_target_step']}, "
              f"{t['ms_per_step']:.1f} ms/step, final {t['final_accuracy']:.4f}) | torch "
              f"{q['to_target_s']} s (step {q['to_target_step']}, {q['ms_per_step']:.1f} ms/step, "
              f"final {q['final_accuracy']:.4f}, {q['threads']} thread(s))", flush=True)

    def median(side, key):
        values = [r[side][key] for r in results if r[side][key] is not None]
        return statistics.median(values) if values else None

    summary = {side: {k: median(side, k) for k in ("to_target_s", "to_target_step", "ms_per_step",
                                                    "final_accuracy")}
               for side in ("tandem", "torch")}
    summary["reached"] = {side: sum(r[side]["to_target_s"] is not None for r in results)
                          for side in ("tandem", "torch")}
    summary["runs"] = len(results)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
