"""tandem against torch.distributed across hosts, on a shaped network, in one run.

Builds a cluster of --hosts network namespaces (bench/netns_cluster.py), each
link shaped to --rate-gbit (tc tbf) and --delay-ms (tc netem, where the
kernel has it), runs --nproc-per-host ranks per host, and measures, side by
side:

* all-reduce of --size-mb MiB (float32, sum): tandem's default path
  (hierarchical: shared memory inside a host, Gloo between hosts), tandem
  forced onto one flat Gloo ring (bench_allreduce --hierarchical off), and torch.distributed
  Gloo under torchrun; with --forms also the leader and split hierarchical
  forms, each forced (leader_/split_allreduce_busbw_gbps);
* a DDP step (bench_ddp / bench_ddp.py, both with --bucket-mb): tandem
  against torch DDP, with tandem's phases, its compute alone and its
  all-reduce alone (ddp_breakdown);
* a ZeRO-3 step and an HSDP step (bench_zero --stage 3, with and without
  --hpz-partition-size = ranks per host): step time and inter-host bytes per
  step, counted on the links (the hosts' eth0 tx counters), as the difference
  between a run of 2S and one of S steps so that setup traffic cancels.

    sudo .venv/bin/python bench/compare_multihost.py --build build --hosts 2 \\
        --nproc-per-host 2 --rate-gbit 2 --delay-ms 0.2 --size-mb 64

Every bandwidth in the JSON line is in Gbit/s (bits, as link rates are
quoted): link_gbps is what one TCP stream measured between two hosts,
busbw = algbw * 2 (n - 1) / n with n the world size. The last line is JSON.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from bench_common import BENCH_DIR, last_json, peer_python
from netns_cluster import NetnsCluster

TOKEN = "5" * 64


class Job:
    """One multi-host job: a launcher per host; raises with the output on failure."""

    def __init__(self, cluster, argv_for_host, env, timeout):
        self.procs, self.logs = [], []
        for host in range(len(cluster.hosts)):
            log = tempfile.TemporaryFile()
            self.logs.append(log)
            self.procs.append(cluster.popen(host, argv_for_host(host), env=env, stdout=log,
                                            stderr=subprocess.STDOUT))
        self.timeout = timeout

    def wait(self):
        deadline = time.monotonic() + self.timeout
        while any(p.poll() is None for p in self.procs):
            if time.monotonic() > deadline or any(p.returncode not in (None, 0)
                                                  for p in self.procs):
                break
            time.sleep(0.05)
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        outputs = []
        for log in self.logs:
            log.seek(0)
            outputs.append(log.read().decode(errors="replace"))
            log.close()
        for host, (p, out) in enumerate(zip(self.procs, outputs)):
            if p.returncode != 0:
                raise RuntimeError(f"host {host}: {' '.join(p.args)} exited with "
                                   f"{p.returncode}:\n{out[-3000:]}")
        return outputs


class Bench:
    def __init__(self, args, cluster):
        self.args = args
        self.cluster = cluster
        self.port = 29700

    def next_port(self):
        self.port += 1
        return str(self.port)

    def env(self, extra=None):
        env = dict(os.environ, OMP_NUM_THREADS="1", TANDEM_STORE_TOKEN=TOKEN,
                   GLOO_SOCKET_IFNAME="eth0")
        env.update(extra or {})
        return env

    def tandem(self, program, program_args, extra_env=None):
        """Runs a tandem bench program on every host; returns rank 0's JSON."""
        a = self.args
        port = self.next_port()

        def argv(host):
            return [os.path.join(a.build, "bin", "tandem"), "launch", "--nnodes",
                    str(a.hosts), "--node-rank", str(host), "--nproc-per-node",
                    str(a.nproc_per_host), "--master-addr", self.cluster.addresses[0],
                    "--master-port", port, "--no-prefix",
                    os.path.join(a.build, "bin", program)] + program_args

        return last_json(Job(self.cluster, argv, self.env(extra_env), a.timeout).wait()[0])

    def torch(self, script, script_args):
        """Runs a torch script under torchrun on every host; returns rank 0's JSON."""
        a = self.args
        port = self.next_port()

        def argv(host):
            return [a.python, "-m", "torch.distributed.run", "--nnodes", str(a.hosts),
                    "--node-rank", str(host), "--nproc-per-node", str(a.nproc_per_host),
                    "--master-addr", self.cluster.addresses[0], "--master-port", port,
                    os.path.join(BENCH_DIR, script)] + script_args

        return last_json(Job(self.cluster, argv, self.env(), a.timeout).wait()[0])

    def interhost_bytes(self, run):
        """Bytes all hosts sent onto their links while `run()` ran, and its result."""
        before = sum(self.cluster.tx_bytes(h) for h in range(len(self.cluster.hosts)))
        result = run()
        after = sum(self.cluster.tx_bytes(h) for h in range(len(self.cluster.hosts)))
        return after - before, result


def measure_link(cluster, megabytes=256):
    """Gbit/s of one TCP stream from host 1 to host 0, timed at the receiver."""
    server = ("import socket,time\n"
              "s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
              f"s.bind(('{cluster.addresses[0]}', 29699)); s.listen(1); print('ready', flush=True)\n"
              "c,_=s.accept(); n=0; t=None\n"
              "while True:\n"
              "  b=c.recv(1<<20)\n"
              "  if t is None: t=time.perf_counter()\n"
              "  if not b: break\n"
              "  n+=len(b)\n"
              "print(n*8/(time.perf_counter()-t)/1e9)\n")
    client = ("import socket\n"
              f"c=socket.create_connection(('{cluster.addresses[0]}', 29699))\n"
              f"buf=b'x'*(1<<20)\n"
              f"for _ in range({megabytes}): c.sendall(buf)\n"
              "c.close()\n")
    srv = cluster.popen(0, [sys.executable, "-c", server], stdout=subprocess.PIPE, text=True)
    assert srv.stdout.readline().strip() == "ready"
    subprocess.run(cluster.argv(1, [sys.executable, "-c", client]), check=True, timeout=120)
    out, _ = srv.communicate(timeout=120)
    return float(out.strip())


def busbw_gbit(result, size_mb):
    """The bus bandwidth at `size_mb` of a bench_allreduce JSON line, in Gbit/s."""
    for row in result["results"]:
        if abs(row["mb"] - size_mb) < 1e-9:
            return row["busbw_gbps"] * 8
    raise RuntimeError(f"no {size_mb} MiB row in {result}")


def allreduce_sides(bench, a):
    sizes = ["--sizes-mb", str(a.size_mb), "--iters", str(a.iters), "--warmup", str(a.warmup)]
    sides = {
        "tandem": lambda: bench.tandem("bench_allreduce", sizes),
        "flat": lambda: bench.tandem("bench_allreduce", sizes + ["--hierarchical", "off"]),
        "torch": lambda: bench.torch("bench_allreduce.py", sizes),
    }
    if a.forms and a.nproc_per_host > 1 and a.hosts > 1:
        # The two hierarchical forms forced, so the automatic choice can be
        # checked against both on these links.
        for form in ("leader", "split"):
            sides[form] = (lambda f: lambda: bench.tandem(
                "bench_allreduce", sizes + ["--hierarchical", f]))(form)
    runs = {name: [] for name in sides}
    names = list(sides)
    for rep in range(a.reps):
        for name in names[rep % len(names):] + names[:rep % len(names)]:
            result = sides[name]()
            runs[name].append(busbw_gbit(result, a.size_mb))
            if name == "tandem":
                runs.setdefault("tandem_path", []).append(result.get("path", result.get("transport")))
    return runs


def step_sides(bench, a):
    ddp = ["--width", str(a.width), "--depth", str(a.depth), "--batch", str(a.batch),
           "--steps", str(a.steps), "--warmup", str(a.warmup), "--bucket-mb", str(a.bucket_mb)]
    out = {"ddp": [], "torch_ddp": []}
    for rep in range(a.reps):
        order = ["ddp", "torch_ddp"] if rep % 2 == 0 else ["torch_ddp", "ddp"]
        for name in order:
            if name == "ddp":
                result = bench.tandem("bench_ddp", ddp)
                out[name].append(result["step_ms"])
                # Where tandem's step goes (the last run's medians): its
                # phases, the same steps without communication, and the
                # all-reduce of the whole gradient alone.
                out["ddp_breakdown"] = {key: result[key] for key in
                                        ("ddp", "compute", "compute_ms", "allreduce_ms")}
            else:
                out[name].append(bench.torch("bench_ddp.py", ddp)["step_ms"])
    return out


def sharded_sides(bench, a):
    """ZeRO-3 and HSDP: median step time and inter-host bytes per step."""
    base = ["--stage", "3", "--width", str(a.width), "--depth", str(a.depth), "--batch",
            str(a.batch), "--warmup", str(a.warmup)]
    out = {}
    for name, extra in (("zero3", []),
                        ("hsdp", ["--hpz-partition-size", str(a.nproc_per_host)])):
        short_bytes, short = bench.interhost_bytes(
            lambda: bench.tandem("bench_zero", base + extra + ["--steps", str(a.steps)]))
        long_bytes, long = bench.interhost_bytes(
            lambda: bench.tandem("bench_zero", base + extra + ["--steps", str(2 * a.steps)]))
        out[name + "_step_ms"] = statistics.median([short["step_ms"], long["step_ms"]])
        # Each step's inter-host bytes, as the links counted them (setup and
        # warm-up cancel in the difference).
        out[name + "_interhost_bytes_per_step"] = (long_bytes - short_bytes) / a.steps
        # What tandem's counter says crossed shard groups (HSDP only).
        out[name + "_replicate_payload_bytes_per_step"] = long.get("replicate_bytes_per_step")
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default="build", help="tandem build directory")
    parser.add_argument("--python", default=peer_python(), help="Python with torch")
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument("--nproc-per-host", type=int, default=2)
    parser.add_argument("--rate-gbit", type=float, default=2.0, help="link rate (0: unshaped)")
    parser.add_argument("--delay-ms", type=float, default=0.2, help="one-way link delay")
    parser.add_argument("--size-mb", type=float, default=64.0, help="all-reduce size in MiB")
    parser.add_argument("--iters", type=int, default=10, help="timed iterations per size/step")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--reps", type=int, default=2, help="repetitions of each side")
    parser.add_argument("--width", type=int, default=1024, help="DDP/ZeRO model width")
    parser.add_argument("--depth", type=int, default=4, help="DDP/ZeRO model depth")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=10, help="timed DDP/ZeRO steps")
    parser.add_argument("--bucket-mb", type=float, default=25.0,
                        help="DDP bucket_cap_mb on both sides (torch's default 25)")
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--forms", action="store_true",
                        help="also time the leader and split hierarchical forms, each forced")
    parser.add_argument("--skip", default="", help="comma list of allreduce,ddp,sharded to skip")
    a = parser.parse_args()
    skip = set(filter(None, a.skip.split(",")))
    a.steps = max(a.steps, 1)
    a.iters = max(a.iters, 1)

    result = {"hosts": a.hosts, "nproc_per_host": a.nproc_per_host, "rate_gbit": a.rate_gbit,
              "bucket_mb": a.bucket_mb,
              "delay_ms": a.delay_ms, "size_mb": a.size_mb}
    with NetnsCluster(a.hosts, a.rate_gbit, a.delay_ms) as cluster:
        result["delay_applied"] = cluster.delay_applied
        result["link_gbps"] = measure_link(cluster) if a.hosts > 1 else None
        bench = Bench(a, cluster)
        if "allreduce" not in skip:
            runs = allreduce_sides(bench, a)
            result["allreduce_busbw_gbps"] = statistics.median(runs["tandem"])
            result["flat_allreduce_busbw_gbps"] = statistics.median(runs["flat"])
            result["torch_allreduce_busbw_gbps"] = statistics.median(runs["torch"])
            result["allreduce_runs"] = runs
            for form in ("leader", "split"):
                if form in runs:
                    result[f"{form}_allreduce_busbw_gbps"] = statistics.median(runs[form])
            result["allreduce_vs_torch"] = (result["allreduce_busbw_gbps"] /
                                            result["torch_allreduce_busbw_gbps"])
            if result["link_gbps"]:
                result["allreduce_busbw_vs_link"] = (result["allreduce_busbw_gbps"] /
                                                     result["link_gbps"])
        if "ddp" not in skip:
            steps = step_sides(bench, a)
            result["ddp_step_ms"] = statistics.median(steps["ddp"])
            result["torch_ddp_step_ms"] = statistics.median(steps["torch_ddp"])
            result["ddp_step_ratio"] = result["ddp_step_ms"] / result["torch_ddp_step_ms"]
            result["ddp_breakdown"] = steps.pop("ddp_breakdown")
            result["ddp_runs"] = steps
        if "sharded" not in skip:
            result.update(sharded_sides(bench, a))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
