"""Writes the GPU kit's summary.json (scripts/gpu_kit.sh run): every check with
passed / failed / skipped and its reason, and the figures (docs/gpu.md).

Checks come from tandem_gpu_tests' gtest JSON (one per test), the build, and
the demo-against-Python speed runs in speed.log. Figures come from the
tests' TANDEM_GPU_FIGURES lines and from the demo's final JSON lines. Exits 1
naming the failed checks when any failed.
"""
import argparse
import json
import os
import re
import sys


def skip_reasons(log_path):
    """Test name -> the message of its GTEST_SKIP, read from the test log
    (gtest 1.12's JSON report does not carry it)."""
    reasons, pending = {}, None
    if not os.path.exists(log_path):
        return reasons
    for line in open(log_path, errors="replace"):
        line = line.rstrip("\n")
        if line.endswith(": Skipped"):
            pending = []
        elif line.startswith("[  SKIPPED ] ") and pending is not None:
            name = line[len("[  SKIPPED ] "):].split(" (")[0]
            reasons[name] = " ".join(pending).strip()
            pending = None
        elif pending is not None and not line.startswith("["):
            pending.append(line.strip())
    return reasons


def out_of_time(log_path):
    """The tests the kit did not start because its deadline had passed."""
    if not os.path.exists(log_path):
        return []
    return [line[len("=== out of time "):].strip() for line in open(log_path, errors="replace")
            if line.startswith("=== out of time ")]


def exit_codes(log_path):
    """Test name -> the exit status of its process, from the `=== exit` lines."""
    codes = {}
    if os.path.exists(log_path):
        for line in open(log_path, errors="replace"):
            if line.startswith("=== exit "):
                _, _, code, name = line.split(maxsplit=3)
                codes[name.strip()] = int(code)
    return codes


def gtest_checks(report_dir, log_path, merged_path):
    """One check per test from the per-test gtest JSON reports, merged into
    one report at `merged_path`; a test whose process died without a report
    is failed with its exit status."""
    reasons, codes = skip_reasons(log_path), exit_codes(log_path)
    merged = {"testsuites": []}
    checks = []
    seen = set()
    for file in sorted(os.listdir(report_dir)) if os.path.isdir(report_dir) else []:
        if not file.endswith(".json") or not os.path.isfile(os.path.join(report_dir, file)):
            continue
        report = json.load(open(os.path.join(report_dir, file)))
        for suite in report.get("testsuites", []):
            merged["testsuites"].append(suite)
            for test in suite.get("testsuite", []):
                name = f"{suite['name']}.{test['name']}"
                seen.add(name)
                failures = test.get("failures", [])
                if failures:
                    first = [f["failure"].strip().splitlines()[0] if f["failure"].strip() else ""
                             for f in failures]
                    checks.append({"name": name, "status": "failed",
                                   "reason": " | ".join(first)[:2000],
                                   "failures": [f["failure"][:4000] for f in failures]})
                elif test.get("result") == "SKIPPED":
                    checks.append({"name": name, "status": "skipped",
                                   "reason": reasons.get(name) or "skipped (no message)"})
                else:
                    checks.append({"name": name, "status": "passed", "time_s": test.get("time")})
    for name, code in codes.items():
        if name not in seen:
            how = {124: "timed out (killed)", 137: "killed after the timeout"}.get(
                code, f"died with exit status {code}" + (f" (signal {code - 128})"
                                                          if code > 128 else ""))
            checks.append({"name": name, "status": "failed",
                           "reason": f"{how} before writing its report (gpu-tests.log)"})
    for name in out_of_time(log_path):
        checks.append({"name": name, "status": "skipped",
                       "reason": "not run: past the kit's deadline (TANDEM_GPU_KIT_DEADLINE)"})
    if not codes:
        checks.append({"name": "tandem_gpu_tests", "status": "failed",
                       "reason": "no test ran (gpu-tests.log)"})
    with open(merged_path, "w") as f:
        json.dump(merged, f, indent=1)
    return checks


def speed_runs(path):
    """The last JSON line of each `== ...` section of speed.log."""
    runs, current, last = {}, None, None
    if not os.path.exists(path):
        return runs
    for line in open(path, errors="replace"):
        line = line.rstrip("\n")
        if line.startswith("== "):
            current, last = line[3:], None
            runs[current] = {"exit": None, "result": None}
        elif current and line.startswith("exit "):
            runs[current]["exit"] = int(line.split()[1])
        elif current:
            # tandem's launcher prefixes worker lines with "[rank0]: ".
            text = re.sub(r"^\[rank\d+\]:\s*", "", line)
            if text.startswith("{") and text.endswith("}"):
                try:
                    runs[current]["result"] = json.loads(text)
                except ValueError:
                    pass
    return runs


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--times", default="")
    p.add_argument("--build-failed", action="store_true")
    a = p.parse_args()

    summary = {"times_s": {k: int(v) for k, v in
                           (item.split("=") for item in a.times.split(",") if item)}}
    torch_json = os.path.join(a.work, "torch.json")
    if os.path.exists(torch_json):
        summary["machine"] = json.load(open(torch_json))
    checks = [{"name": "build", "status": "failed" if a.build_failed else "passed",
               "reason": "configure or build failed (build.log)" if a.build_failed else ""}]
    figures = {}
    if not a.build_failed:
        checks += gtest_checks(os.path.join(a.work, "gtest"),
                               os.path.join(a.out, "gpu-tests.log"),
                               os.path.join(a.out, "gtest.json"))
        figures_file = os.path.join(a.work, "figures.jsonl")
        if os.path.exists(figures_file):
            for line in open(figures_file):
                entry = json.loads(line)
                figures[entry.pop("check")] = entry
        runs = speed_runs(os.path.join(a.out, "speed.log"))
        speed = {}
        skipped = next((name[len("skipped: "):] for name in runs
                        if name.startswith("skipped: ")), None)
        for precision in ("no", "bf16"):
            started = any(name.endswith(f"--mixed-precision {precision}") for name in runs)
            if skipped and not started:
                for side in ("tandem", "python"):
                    checks.append({"name": f"speed.{side}_gpt_addition_{precision}",
                                   "status": "skipped", "reason": skipped})
                continue
            ours = runs.get(f"tandem gpt_addition --mixed-precision {precision}", {})
            peer = runs.get(f"python bench/gpt_addition.py --mixed-precision {precision}", {})
            for side, run in (("tandem", ours), ("python", peer)):
                ok = run.get("exit") == 0 and run.get("result") is not None
                checks.append({"name": f"speed.{side}_gpt_addition_{precision}",
                               "status": "passed" if ok else "failed",
                               "reason": "" if ok else f"exit {run.get('exit')}, no result line "
                                                       "(speed.log)"})
            if ours.get("result") and peer.get("result"):
                t, py = ours["result"], peer["result"]
                speed[precision] = {
                    "tandem_tokens_per_s": t["tokens_per_s"],
                    "python_tokens_per_s": py["tokens_per_s"],
                    "tandem_over_python": t["tokens_per_s"] / py["tokens_per_s"],
                    "tandem_peak_cuda_mb": t.get("peak_cuda_mb"),
                    "python_peak_cuda_mb": py.get("peak_cuda_mb"),
                    "tandem_accuracy": t.get("accuracy"),
                    "python_accuracy": py.get("accuracy"),
                    "steps": t.get("step"),
                }
        figures["gpt_addition_one_gpu"] = speed
        # bench/compare_gpt2.py's cases (gpt2.jsonl), without their loss lists.
        gpt2_file = os.path.join(a.out, "gpt2.jsonl")
        if os.path.exists(gpt2_file):
            figures["gpt2"] = [{k: v for k, v in json.loads(line).items() if k != "losses"}
                               for line in open(gpt2_file) if line.strip()]
    summary["checks"] = checks
    summary["figures"] = figures
    counts = {s: sum(c["status"] == s for c in checks) for s in ("passed", "failed", "skipped")}
    summary["counts"] = counts
    with open(os.path.join(a.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(f"gpu_kit: {counts['passed']} passed, {counts['failed']} failed, "
          f"{counts['skipped']} skipped; summary in {os.path.join(a.out, 'summary.json')}")
    for c in checks:
        if c["status"] != "passed":
            print(f"  {c['status']}: {c['name']}: {c.get('reason', '')[:300]}")
    if figures:
        print("gpu_kit: figures: " + json.dumps(figures))
    sys.exit(1 if counts["failed"] else 0)


if __name__ == "__main__":
    main()
