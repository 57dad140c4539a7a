"""The ACCELERATE_* and FSDP_* variables that `accelerate launch --config_file
CONFIG SCRIPT` gives its worker processes, as one JSON object on stdout.

usage: accelerate_env.py CONFIG [--script S] [--other] [accelerate launch flags...]

Nothing here knows a variable: the launch line goes through accelerate's own
launch_command_parser() and launch_command(), so _validate_launch_command
fills args from the config and the launcher that accelerate picks calls
prepare_simple_launcher_cmd_env, prepare_multi_gpu_env or
prepare_deepspeed_cmd_env. Only the spawning is replaced: torchrun
(torch.distributed.run.run, whose workers inherit os.environ as the launcher
patched it) and subprocess.Popen in accelerate's launch module (simple
launcher, multi-node DeepSpeed runner) record the environment instead.
ACCELERATE_*/FSDP_* inherited from the caller are removed first, so every one
printed was set by accelerate. --other adds {"other": ...}: the remaining
variables accelerate sets or changes (MASTER_ADDR, OMP_NUM_THREADS, ...).
With accelerate 1.15 this matched, variable for variable, what every worker
of a real `accelerate launch` of an os.environ dump saw on a CPU-only host,
for each config in tests/config/data it accepts (torchrun runs fine there).

No GPU patch is needed: with a config file accelerate does not ask torch.cuda
anything (it counts devices only without a config), and
check_cuda_p2p_ib_support runs nvidia-smi and answers True when it is absent.
is_port_in_use is left real: a busy port on this host only makes a
single-node torchrun standalone (no variable changes), but stops a multi-node
rank 0 as the real launch would; patching it would also hide accelerate's
TypeError on a quoted main_process_port there. A config that accelerate
rejects prints its error and exits 1; exits 77 when accelerate cannot be
imported.
"""

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import types
from unittest import mock

try:
    import torch.distributed.run as distrib_run
    from accelerate.commands import launch as accelerate_launch
except Exception as error:  # noqa: BLE001 - any import failure means "skip"
    print(f"accelerate is not importable: {error}", file=sys.stderr)
    sys.exit(77)

PREFIXES = ("ACCELERATE_", "FSDP_")


def launch_env(config, script="train.py", flags=()):
    """(ACCELERATE_*/FSDP_* dict, other set-or-changed variables dict)."""
    saved = dict(os.environ)
    for name in [n for n in os.environ if n.startswith(PREFIXES)]:
        del os.environ[name]
    before = dict(os.environ)
    seen = {}

    def fake_run(_args):  # torchrun's workers inherit os.environ
        seen.update(os.environ)

    class FakePopen:  # the simple launcher passes env= explicitly
        returncode = 0

        def __init__(self, _cmd, env=None, **_kwargs):
            seen.update(os.environ if env is None else env)

        def wait(self):
            return 0

    fake_subprocess = types.SimpleNamespace(Popen=FakePopen,
                                            CalledProcessError=subprocess.CalledProcessError)
    args = accelerate_launch.launch_command_parser().parse_args(
        ["--config_file", os.path.abspath(config), *flags, script])
    cwd = os.getcwd()
    try:
        # A temporary cwd keeps a multi-node DeepSpeed launch's .deepspeed_env
        # out of the caller's directory (the DeepSpeed path also appends the
        # cwd to PYTHONPATH). accelerate and DeepSpeed chatter goes to stderr.
        with tempfile.TemporaryDirectory() as scratch, \
                contextlib.redirect_stdout(sys.stderr), \
                mock.patch.object(distrib_run, "run", fake_run), \
                mock.patch.object(accelerate_launch, "subprocess", fake_subprocess):
            os.chdir(scratch)
            accelerate_launch.launch_command(args)
    finally:
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(saved)
    ours = {k: v for k, v in sorted(seen.items()) if k.startswith(PREFIXES)}
    other = {k: v for k, v in sorted(seen.items())
             if not k.startswith(PREFIXES) and before.get(k) != v}
    return ours, other


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config")
    parser.add_argument("--script", default="train.py")
    parser.add_argument("--other", action="store_true")
    options, flags = parser.parse_known_args()
    try:
        ours, other = launch_env(options.config, options.script, flags)
    except (Exception, SystemExit) as error:  # noqa: BLE001 - report accelerate's refusal
        print(f"accelerate rejects {options.config}: {type(error).__name__}: {error}",
              file=sys.stderr)
        sys.exit(1)
    print(json.dumps({**ours, "other": other} if options.other else ours, indent=1))


if __name__ == "__main__":
    main()
