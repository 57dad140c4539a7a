"""A cluster of hosts on one machine for the multi-host benchmarks.

Each host is a network namespace with one veth link to a bridge in a
"switch" namespace; hosts reach each other at 10.232.0.1 .. 10.232.0.H and
nothing else (the root namespace gets no interface or route). Each link is
shaped in both directions: the host's eth0 egress and the switch port's
egress (towards the host), so a host's NIC carries at most `rate_gbit` each
way, as a real host's would. Rate shaping uses tc's token bucket (tbf);
delay needs tc netem, which some VM kernels lack: `delay_applied` says
whether the delay is on. Ranks of one host talk over that namespace's
loopback (and tandem's shared memory), which is not shaped.

    with NetnsCluster(2, rate_gbit=2, delay_ms=0.2) as cluster:
        proc = cluster.popen(1, ["hostname"])
        cluster.tx_bytes(1)  # bytes host 1 sent onto its link so far

Needs root (or CAP_SYS_ADMIN) and iproute2. Removes its namespaces on exit,
and on start those of earlier runs whose process no longer exists.
"""
import os
import re
import subprocess

PREFIX = "tmb"
SUBNET = "10.232.0."


def _ip(*args, check=True):
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True)


def _remove_stale():
    """Deletes the namespaces of earlier runs whose owning process is gone."""
    listing = _ip("netns", "list", check=False).stdout
    for name in re.findall(rf"^({PREFIX}(\d+)\S*)", listing, re.M):
        ns, pid = name
        if not os.path.exists(f"/proc/{pid}"):
            _kill_in(ns)
            _ip("netns", "del", ns, check=False)


def _kill_in(ns):
    pids = _ip("netns", "pids", ns, check=False).stdout.split()
    for pid in pids:
        try:
            os.kill(int(pid), 9)
        except (ProcessLookupError, ValueError):
            pass


class NetnsCluster:
    def __init__(self, hosts, rate_gbit=0.0, delay_ms=0.0):
        if os.geteuid() != 0:
            raise PermissionError("the multi-host benchmark builds network namespaces: run it as root")
        _remove_stale()
        self.prefix = f"{PREFIX}{os.getpid()}"
        self.switch = self.prefix + "sw"
        self.hosts = [f"{self.prefix}h{i}" for i in range(hosts)]
        self.addresses = [SUBNET + str(i + 1) for i in range(hosts)]
        self.rate_gbit = rate_gbit
        self.delay_ms = delay_ms
        self.delay_applied = delay_ms <= 0
        self._made = []
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    def _build(self):
        _ip("netns", "add", self.switch)
        self._made.append(self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        for i, host in enumerate(self.hosts):
            _ip("netns", "add", host)
            self._made.append(host)
            port = f"s{i}"
            _ip("-n", self.switch, "link", "add", port, "type", "veth", "peer", "name", "eth0",
                "netns", host)
            _ip("-n", self.switch, "link", "set", port, "master", "br0", "up")
            _ip("-n", host, "addr", "add", self.addresses[i] + "/24", "dev", "eth0")
            _ip("-n", host, "link", "set", "eth0", "up")
            _ip("-n", host, "link", "set", "lo", "up")
            self._shape(host, "eth0")
            self._shape(self.switch, port)

    def _shape(self, ns, dev):
        """Limits `dev`'s egress to rate_gbit, with delay_ms when netem exists."""
        if self.rate_gbit <= 0 and self.delay_ms <= 0:
            return
        tc = ["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev]
        # netem can both delay and limit the rate; where the kernel has it, one
        # qdisc does both.
        if self.delay_ms > 0:
            netem = ["netem", "delay", f"{self.delay_ms}ms", "limit", "100000"]
            if self.rate_gbit > 0:
                netem += ["rate", f"{self.rate_gbit}gbit"]
            if subprocess.run(tc + ["root"] + netem, capture_output=True).returncode == 0:
                self.delay_applied = True
                return
        if self.rate_gbit > 0:
            # The bucket must hold at least one timer tick of traffic (1 ms at
            # HZ=1000), else tbf cannot reach the rate.
            burst = max(256 * 1024, int(self.rate_gbit * 1e9 / 8 / 500))
            subprocess.run(tc + ["root", "tbf", "rate", f"{self.rate_gbit}gbit", "burst",
                                 str(burst), "latency", "20ms"], check=True, capture_output=True)

    def argv(self, host, cmd):
        """`cmd` run inside host `host`'s namespace."""
        return ["ip", "netns", "exec", self.hosts[host]] + list(cmd)

    def popen(self, host, cmd, env=None, **kwargs):
        return subprocess.Popen(self.argv(host, cmd), env=env, **kwargs)

    def tx_bytes(self, host):
        """Bytes host `host` has sent onto its link (its eth0), so far."""
        out = subprocess.run(self.argv(host, ["cat", "/sys/class/net/eth0/statistics/tx_bytes"]),
                             check=True, capture_output=True, text=True).stdout
        return int(out)

    def close(self):
        for ns in reversed(self._made):
            _kill_in(ns)
            _ip("netns", "del", ns, check=False)
        self._made = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
