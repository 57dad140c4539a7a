"""Helpers shared by the compare_*.py drivers: starting ranks, reading output."""
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
RANK_PREFIX = re.compile(r"^\[rank[^\]]*\]:\s?")


def free_port():
    """A TCP port that was free a moment ago, for MASTER_PORT."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def strip_prefix(line):
    """Drops the `[rankN]: ` that `tandem launch` puts before each line."""
    return RANK_PREFIX.sub("", line)


def last_json(text):
    """The last line of `text` that parses as a JSON object."""
    for line in reversed(text.splitlines()):
        line = strip_prefix(line).strip()
        if line.startswith("{"):
            return json.loads(line)
    raise RuntimeError("no JSON line in output:\n" + text[-2000:])


def rank_env(rank, world, port):
    """Environment for one rank of a single-node job, as torchrun would set it."""
    env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
               LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               OMP_NUM_THREADS="1")
    env.pop("TORCHELASTIC_USE_AGENT_STORE", None)
    return env


def _finish(procs, logs, timeout):
    """Waits for every process; returns their outputs (stdout+stderr), in order.

    A failed rank leaves its peers blocked in a collective until Gloo's own
    timeout, so the first failure (or the deadline) ends all of them.
    """
    deadline = time.monotonic() + timeout
    while any(p.poll() is None for p in procs):
        failed = any(p.returncode not in (None, 0) for p in procs)
        timed_out = time.monotonic() > deadline
        if failed or timed_out:
            for p in procs:
                if p.poll() is None:
                    p.kill()
            if timed_out:
                raise TimeoutError(f"{' '.join(procs[0].args)} ran past {timeout} s")
            break
        time.sleep(0.05)
    for p in procs:
        p.wait()
    outputs = []
    for log in logs:
        log.seek(0)
        outputs.append(log.read().decode(errors="replace"))
        log.close()
    # Report the rank that failed by itself, not one this function killed.
    failures = [(p, out) for p, out in zip(procs, outputs) if p.returncode != 0]
    failures.sort(key=lambda failure: failure[0].returncode == -signal.SIGKILL)
    for p, out in failures[:1]:
        raise RuntimeError(f"{' '.join(p.args)} exited with {p.returncode}:\n{out[-2000:]}")
    return outputs


def start(cmd, env=None):
    """Starts `cmd` with its output going to a temporary file; returns (proc, file)."""
    log = tempfile.TemporaryFile()
    return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT), log


def run_ranks(cmd, world, timeout=600):
    """Starts `world` copies of `cmd` as ranks of one job; returns their outputs."""
    port = free_port()
    started = [start(cmd, rank_env(r, world, port)) for r in range(world)]
    return _finish([p for p, _ in started], [log for _, log in started], timeout)


def run_launcher(cmd, timeout=600):
    """Runs a launcher (`tandem launch ...`, torchrun); returns its output."""
    proc, log = start(cmd, dict(os.environ, OMP_NUM_THREADS="1"))
    return _finish([proc], [log], timeout)[0]


def run_torch(args, script_args, world, timeout=600):
    """Runs PyTorch's side: `python -m torch.distributed.run --standalone` (torchrun),
    as its users start it, or with --no-torchrun plain ranks with the
    environment torchrun would set. Returns the outputs (one, interleaved,
    under torchrun: rank 0 prints the JSON line)."""
    if args.no_torchrun:
        return run_ranks([args.python] + script_args, world, timeout)
    torchrun = [args.python, "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node", str(world)]
    return [run_launcher(torchrun + script_args, timeout)]


def add_common_args(parser):
    """Options both drivers share: where the binaries are and how to start them."""
    parser.add_argument("--build", default="build",
                        help="tandem build directory (binaries in <build>/bin)")
    parser.add_argument("--launcher", help="tandem CLI (default <build>/bin/tandem)")
    parser.add_argument("--no-launcher", action="store_true",
                        help="start tandem ranks directly, not through `tandem launch`")
    parser.add_argument("--python", default=peer_python(),
                        help="Python with torch (default: the project's .venv, from scripts/setup.sh)")
    parser.add_argument("--no-torchrun", action="store_true",
                        help="start PyTorch's ranks directly, not through torchrun")


def peer_python():
    """The Python that runs PyTorch's side: .venv/bin/python (pip's torch 2.13)."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    venv = os.path.join(repo, ".venv", "bin", "python")
    return venv if os.path.exists(venv) else sys.executable


def tandem_paths(args, program):
    """(launcher, program) paths; exits with a build hint when one is missing."""
    launcher = args.launcher or os.path.join(args.build, "bin", "tandem")
    program = os.path.join(args.build, "bin", program)
    needed = [(program, os.path.basename(program))]
    if not args.no_launcher:
        needed.append((launcher, "tandem_cli"))
    for path, target in needed:
        if not os.access(path, os.X_OK):
            sys.exit(f"{path} not found: build it with "
                     f"`cmake --build {args.build} --target {target}`")
    return launcher, program


def cosine_ratio(iteration, warmup, total, floor):
    """DeepSpeed's WarmupCosineLR ratio (linear warmup), which tandem's
    WarmupCosineLR follows, after `iteration` (-1: before any step)."""
    if iteration < 0:
        return 0.0
    if iteration < warmup:
        return iteration / warmup
    progress = min(1.0, (iteration - warmup + 1) / max(1, total - warmup))
    return max(0.0, floor + (1 - floor) * (1 + math.cos(math.pi * progress)) / 2)
