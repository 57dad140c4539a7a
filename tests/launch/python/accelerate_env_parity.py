"""A Python script launched by `tandem launch --config-file F` sees the
ACCELERATE_*, FSDP_* and PARALLELISM_CONFIG_* variables that `accelerate
launch --config_file F` gives it: for every Accelerate config in the corpus
that accelerate accepts, and for launch lines with accelerate's flags.

usage: accelerate_env_parity.py TANDEM [--data DIR]

accelerate's side comes from accelerate_env.launch_env (its own launch code
with the spawn replaced; it matched real `accelerate launch` runs). tandem's
side is a real `tandem launch` of /usr/bin/env on one process. Prints each
disagreement; exits 1 if there is one, 77 when accelerate cannot be imported.
"""

import argparse
import glob
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import accelerate_env  # noqa: E402 - exits 77 without accelerate

PREFIXES = ("ACCELERATE_", "FSDP_", "PARALLELISM_CONFIG_")

# Launch lines beyond the plain --config_file F: (config, accelerate's flags,
# tandem's flags).
FLAG_CASES = [
    ("accelerate_single_gpu.yaml",
     ["--use_deepspeed", "--zero_stage", "2", "--offload_optimizer_device", "cpu",
      "--gradient_accumulation_steps", "8", "--gradient_clipping", "0.5"],
     ["--use_deepspeed", "--zero_stage", "2", "--offload_optimizer_device", "cpu",
      "--gradient_accumulation_steps", "8", "--gradient_clipping", "0.5"]),
    ("accelerate_deepspeed.yaml", ["--zero_stage", "2", "--mixed_precision", "bf16"],
     ["--zero_stage", "2", "--mixed-precision", "bf16"]),
    ("accelerate_fsdp.yaml", ["--multi_gpu"], ["--multi-gpu"]),
    ("accelerate_ds_file.yaml", ["--use_deepspeed"], ["--use_deepspeed"]),
]


# Files `accelerate launch` starts but tandem launch refuses, with the reason
# tandem must give: Accelerate's own worker refuses them once the script
# builds its Accelerator, or they ask for what tandem states it lacks.
REFUSED = {
    "accelerate_context_parallel.yaml": "context parallelism of size 2 is not supported",
    "accelerate_ds_file_without_zero.yaml": "which Accelerate requires of a deepspeed_config_file",
    "accelerate_fsdp2_local_state_dict.yaml": "Accelerate refuses it under fsdp_version 2",
    "accelerate_fsdp2_strategy_name.yaml": "under fsdp_version 2 this is true or false",
    "accelerate_ds_file_zero_bool.yaml": "Accelerate's DeepSpeedPlugin reads zero_optimization.stage",
    "accelerate_rdzv_etcd.yaml": "etcd is not supported by tandem",
}


def tandem_env(tandem, config, flags):
    """The prefixed variables a tandem launch worker sees, or an error text."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(PREFIXES)}
    clean.pop("TANDEM_CONFIG_FILE", None)
    # Two processes on this node, whatever the file asks for (HSDP needs an
    # even world), and rank 0's output: only the environment is compared.
    argv = [tandem, "launch", "--config-file", config, *flags, "--standalone",
            "--nproc-per-node", "2", "--local-ranks-filter", "0", "--no-prefix",
            "/usr/bin/env"]
    run = subprocess.run(argv, env=clean, capture_output=True, text=True, timeout=120)
    if run.returncode != 0:
        return None, run.stderr.strip().splitlines()[-1] if run.stderr.strip() else "failed"
    env = dict(line.split("=", 1) for line in run.stdout.splitlines() if "=" in line)
    return {k: v for k, v in sorted(env.items()) if k.startswith(PREFIXES)}, None


def accelerate_side(config, flags):
    try:
        ours, other = accelerate_env.launch_env(config, flags=flags)
    except (Exception, SystemExit):  # noqa: BLE001 - accelerate refuses the file
        return None
    ours.update({k: v for k, v in other.items() if k.startswith(PREFIXES)})
    return dict(sorted(ours.items()))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tandem")
    parser.add_argument("--data", default=os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "..", "config", "data"))
    options = parser.parse_args()
    cases = [(path, [], []) for path in sorted(glob.glob(os.path.join(options.data,
                                                                      "accelerate_*.yaml")))]
    cases += [(os.path.join(options.data, name), a, t) for name, a, t in FLAG_CASES]
    compared, skipped, failures = 0, 0, []
    for path, accelerate_flags, tandem_flags in cases:
        name = os.path.basename(path) + (" " + " ".join(accelerate_flags) if accelerate_flags else "")
        expected = accelerate_side(path, accelerate_flags)
        if expected is None:
            skipped += 1  # accelerate refuses it: nothing to match
            continue
        got, error = tandem_env(options.tandem, path, tandem_flags)
        compared += 1
        reason = REFUSED.get(name)
        if reason is not None:
            if error is None or reason not in error:
                failures.append(f"{name}: tandem launch should refuse it saying '{reason}', "
                                f"got: {error or 'accepted'}")
            continue
        if error is not None:
            failures.append(f"{name}: accelerate accepts it, tandem launch refuses: {error}")
            continue
        for key in sorted(set(expected) | set(got)):
            if expected.get(key) != got.get(key):
                failures.append(f"{name}: {key}: accelerate {expected.get(key)!r}, "
                                f"tandem {got.get(key)!r}")
    for line in failures:
        print(line)
    print(json.dumps({"compared": compared, "accelerate_refuses": skipped,
                      "disagreements": len(failures)}))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
