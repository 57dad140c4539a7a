"""GPT-2 training throughput on one device: the tandem example (examples/gpt2,
eager and with its whole step in a CUDA graph, with tandem's fused
cross-entropy and its LayerNorm fused with the residual add; and the captured
step with the adds apart from the LayerNorm, with LibTorch's loss, LibTorch's
LayerNorm, or both, to measure each) against the same model and
recipe in PyTorch (bench/gpt2_reference.py: eager, torch.compile,
torch.compile mode="reduce-overhead", a manual torch.cuda.graph of the step).

    .venv/bin/python bench/compare_gpt2.py --build build --preset 124m --max-steps 50
    .venv/bin/python bench/compare_gpt2.py --preset tiny --max-steps 5 --cases python-eager,tandem-eager

Every case is its own process, with the same seed, settings and token file
(synthetic, written once, unless --data), and its own time limit
(--case-timeout); a case that times out, crashes or cannot start is recorded
with its reason and the rest go on. tandem's cases run <build>/bin/gpt2
directly (one process, no launcher). On a CPU the CUDA-graph cases are skipped
and reduce-overhead is inductor without CUDA graphs. Prints a table, the
throughput ratios (tandem / PyTorch, > 1: tandem faster), then one JSON line
with every figure.
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile

from bench_common import BENCH_DIR, last_json, peer_python
from gpt2_reference import DEFAULT_BATCH, PRESETS, make_tokens

CASES = ("python-eager", "python-compile", "python-reduce-overhead", "python-cuda-graph",
         "tandem-eager", "tandem-graph", "tandem-graph-adds-apart", "tandem-graph-aten-loss",
         "tandem-graph-aten-ln", "tandem-graph-aten")
NEEDS_CUDA = ("python-cuda-graph", "tandem-graph", "tandem-graph-adds-apart",
              "tandem-graph-aten-loss", "tandem-graph-aten-ln", "tandem-graph-aten")
# tandem's cases and the example's flags for each: the captured step with
# the residual adds apart from tandem's LayerNorm, with LibTorch's
# cross-entropy, or LibTorch's LayerNorm (and plain adds), or both, instead of
# tandem's fused ones measures what each gives.
TANDEM_FLAGS = {"tandem-eager": [], "tandem-graph": ["--cuda-graph"],
                "tandem-graph-adds-apart": ["--cuda-graph", "--layer-norm", "fused"],
                "tandem-graph-aten-loss": ["--cuda-graph", "--loss", "aten"],
                "tandem-graph-aten-ln": ["--cuda-graph", "--layer-norm", "aten"],
                "tandem-graph-aten": ["--cuda-graph", "--loss", "aten", "--layer-norm", "aten"]}
NOTES = {"python-reduce-overhead": {"cpu": "on a CPU: inductor alone, no CUDA graphs"}}


class CaseError(Exception):
    """A case that could not start; its message is the reason recorded."""


def shared_args(a, data):
    """The flags every case gets, the reference and the C++ example alike."""
    args = ["--preset", a.preset, "--batch-size", str(a.batch_size),
            "--max-steps", str(a.max_steps), "--warmup-measure", str(a.warmup_measure),
            "--data", data, "--seed", str(a.seed), "--mixed-precision", a.mixed_precision,
            "--lr", str(a.lr), "--warmup-steps", str(a.warmup_steps),
            "--accumulation", str(a.accumulation), "--device", a.device]
    if a.peak_tflops:
        args += ["--peak-tflops", str(a.peak_tflops)]
    return args + (["--losses"] if a.losses else [])


def command(case, a, data):
    if case.startswith("python-"):
        script = os.path.join(BENCH_DIR, "gpt2_reference.py")
        return [a.python, script, "--case", case[len("python-"):]] + shared_args(a, data)
    program = os.path.join(a.build, "bin", "gpt2")
    if not os.access(program, os.X_OK):
        raise CaseError(f"{program} not found: build the gpt2 target "
                        f"(cmake --build {a.build} --target gpt2)")
    return [program] + shared_args(a, data) + TANDEM_FLAGS[case]


def tail(text, lines=12):
    return "\n".join(text.strip().splitlines()[-lines:])


def run_case(case, a, data):
    """One case in its own process group (torch.compile starts workers), with a
    time limit; returns its JSON line with "status" ok, or the reason it has none."""
    if case in NEEDS_CUDA and a.device != "cuda":
        return {"status": "skipped", "reason": "needs a CUDA device"}
    try:
        cmd = command(case, a, data)
    except CaseError as e:
        return {"status": "failed", "reason": str(e)}
    env = dict(os.environ)
    if a.threads:
        env["OMP_NUM_THREADS"] = str(a.threads)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=a.case_timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return {"status": "timeout", "reason": f"ran past --case-timeout {a.case_timeout} s",
                "command": " ".join(cmd), "stderr_tail": tail(err)}
    if proc.returncode != 0:
        return {"status": "failed", "reason": f"exited with {proc.returncode}: {tail(err, 1)}",
                "command": " ".join(cmd), "stderr_tail": tail(err)}
    try:
        result = last_json(out)
    except (RuntimeError, ValueError) as e:
        return {"status": "failed", "reason": f"no JSON line: {e}", "command": " ".join(cmd)}
    result.setdefault("status", "ok")
    result["command"] = " ".join(cmd)
    note = NOTES.get(case, {}).get(a.device)
    if note:
        result["note"] = note
    return result


def fmt(value, spec):
    """`value` formatted by `spec` ("9.2f"), or a dash as wide."""
    width = int(spec.split(".")[0])
    return "-".rjust(width) if value is None else format(value, spec)


def print_table(results):
    print(f"{'case':<24} {'status':<8} {'tokens/s':>11} {'step ms':>9} {'MFU':>6} "
          f"{'peak MB':>9} {'compile s':>9} {'final loss':>10}")
    for case, r in results.items():
        if r["status"] != "ok":
            print(f"{case:<24} {r['status']:<8} {r['reason']}")
            continue
        print(f"{case:<24} {'ok':<8} {fmt(r.get('tokens_per_s'), '11.0f')} "
              f"{fmt(r.get('step_ms'), '9.2f')} {fmt(r.get('mfu'), '6.1%')} "
              f"{fmt(r.get('peak_memory_mb'), '9.0f')} {fmt(r.get('compile_s'), '9.1f')} "
              f"{fmt(r.get('final_loss'), '10.4f')}" + (f"  ({r['note']})" if r.get("note") else ""))


def ratios(results):
    """Throughput of tandem's cases over PyTorch's (> 1: tandem faster)."""
    speed = {case: r["tokens_per_s"] for case, r in results.items() if r["status"] == "ok"}
    python = {case: v for case, v in speed.items() if case.startswith("python-")}
    best = max(python, key=python.get) if python else None
    over = lambda a, b: speed[a] / speed[b] if a in speed and b in speed else None
    return {"tandem_graph_over_python_eager": over("tandem-graph", "python-eager"),
            "tandem_graph_over_best_python": over("tandem-graph", best) if best else None,
            "best_python": best,
            "tandem_eager_over_python_compile": over("tandem-eager", "python-compile")}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build", default="build", help="tandem build directory (<build>/bin/gpt2)")
    p.add_argument("--python", default=peer_python(), help="Python with torch for the reference")
    p.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    p.add_argument("--device", choices=["cpu", "cuda"], help="default: cuda if available")
    p.add_argument("--mixed-precision", choices=["no", "bf16"],
                   help="default: bf16 on cuda, no on cpu")
    p.add_argument("--batch-size", type=int, help="micro-batch (default per preset: "
                   + ", ".join(f"{k} {v}" for k, v in DEFAULT_BATCH.items()) + ")")
    p.add_argument("--accumulation", type=int, default=1)
    p.add_argument("--max-steps", type=int, default=50, help="timed steps per case")
    p.add_argument("--warmup-measure", type=int, default=5, help="untimed steps first")
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument("--warmup-steps", type=int, default=10)
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--data", help="uint16 token file for every case (default: synthetic)")
    p.add_argument("--peak-tflops", type=float, help="device peak for MFU (default: table)")
    p.add_argument("--threads", type=int, default=0,
                   help="OMP_NUM_THREADS for every case (0: leave it)")
    p.add_argument("--cases", default=",".join(CASES), help="comma list from " + ", ".join(CASES))
    p.add_argument("--case-timeout", type=float, default=240, help="seconds per case")
    p.add_argument("--losses", action="store_true", help="every step's loss in the JSON")
    p.add_argument("--out", help="append each case's result to FILE as a JSON line")
    a = p.parse_args()
    a.cases = [c for c in a.cases.split(",") if c]
    unknown = [c for c in a.cases if c not in CASES]
    if unknown:
        sys.exit(f"--cases: unknown {unknown}; choose from {', '.join(CASES)}")
    if a.device is None:
        import torch
        a.device = "cuda" if torch.cuda.is_available() else "cpu"
    a.mixed_precision = a.mixed_precision or ("bf16" if a.device == "cuda" else "no")
    a.batch_size = a.batch_size or DEFAULT_BATCH[a.preset]
    return a


def main():
    a = parse_args()
    settings = {k: getattr(a, k) for k in ("preset", "batch_size", "accumulation", "max_steps",
                                           "warmup_measure", "mixed_precision", "seed", "lr",
                                           "warmup_steps")}
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        data = a.data
        if data is None:
            data = os.path.join(tmp, "tokens.bin")
            bt = a.batch_size * PRESETS[a.preset]["block_size"]
            steps = a.warmup_measure + a.max_steps
            # One more B*T than the cases read: the offsets never wrap.
            make_tokens(data, (steps * a.accumulation + 1) * bt + 1,
                        PRESETS[a.preset]["vocab_size"], a.seed)
        for case in a.cases:
            print(f"{case} ...", file=sys.stderr, flush=True)
            results[case] = run_case(case, a, data)
            if a.out:
                with open(a.out, "a") as f:
                    f.write(json.dumps(dict(results[case], case=case, **settings)) + "\n")
    print_table(results)
    summary = ratios(results)
    shown = [f"{k} {v:.2f}x" for k, v in summary.items() if isinstance(v, float)]
    print(" | ".join(shown) if shown else "ratios: none (a side has no figure)")
    ok = [r for r in results.values() if r["status"] == "ok"]
    device = next((r["device"] for r in ok), a.device)
    final = [r["final_loss"] for r in ok]
    print(json.dumps({"device": device, **settings, "data": a.data or "synthetic",
                      "cases": results, "ratios": summary,
                      "final_loss_spread": max(final) - min(final) if final else None}))


if __name__ == "__main__":
    main()
