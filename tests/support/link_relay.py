"""A slow, lossy link in user space, for kernels without tc netem.

  link_relay.py A B "delay 50ms loss 1% rate 10mbit"
  link_relay.py --check

Copies Ethernet frames between interfaces A and B in both directions over
AF_PACKET sockets. It holds each frame for the delay and drops it with the
loss probability, like netem on both ends of a link. Prints "ready" once
both sockets are bound, or "error: ..." and exits 2 for a spec it cannot
follow. --check opens one socket on lo and prints "ready": whether this
Python, user and kernel allow the relay at all.

The sockets use PACKET_VNET_HDR: a frame comes with the virtio header that
says how the kernel would segment and checksum it (veth hands over 64 KiB
TSO frames and leaves TCP checksums to be filled in), and goes out with the
same header, so the frame is re-injected as it was taken. As with netem, the
delay and loss apply to a whole such frame.

Standard library only: it runs in the test cluster's switch namespace.
"""
import collections
import random
import re
import select
import socket
import sys
import time

ETH_P_ALL = 0x0003
SOL_PACKET = 263
PACKET_VNET_HDR = 15
PACKET_IGNORE_OUTGOING = 23
PACKET_OUTGOING = 4
FRAME_BYTES = 256 * 1024  # a 64 KiB GSO frame, its headers and room to spare
QUEUE_LIMIT = 1000  # frames waiting per direction, netem's default limit
BUFFER_BYTES = 8 * 1024 * 1024
RATE_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
TIME_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1}
SUPPORTED = 'the relay supports "delay N(us|ms|s)", "loss P%" and "rate N(bit|kbit|mbit|gbit)"'


class SpecError(Exception):
    pass


def parse(spec):
    """{"delay": s, "loss": p, "rate": bits/s} from netem's words."""
    words = spec.split()
    shape = {"delay": 0.0, "loss": 0.0, "rate": 0.0}
    patterns = {
        "delay": (r"(\d+(?:\.\d+)?)(us|ms|s)", lambda n, u: float(n) * TIME_UNITS[u]),
        "loss": (r"(\d+(?:\.\d+)?)%", lambda n: float(n) / 100),
        "rate": (r"(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit)", lambda n, u: float(n) * RATE_UNITS[u]),
    }
    i = 0
    while i < len(words):
        key = words[i]
        if key not in patterns or i + 1 == len(words):
            raise SpecError(f'cannot follow "{" ".join(words[i:])}" in "{spec}": {SUPPORTED}')
        pattern, value = patterns[key]
        match = re.fullmatch(pattern, words[i + 1])
        if not match:
            raise SpecError(f'"{key} {words[i + 1]}" in "{spec}": {SUPPORTED}')
        shape[key] = value(*match.groups())
        i += 2
    if shape["loss"] > 1:
        raise SpecError(f'loss above 100% in "{spec}"')
    return shape


def open_socket(interface):
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    sock.setsockopt(SOL_PACKET, PACKET_VNET_HDR, 1)
    try:  # Linux 4.20+; the pkttype check below covers older kernels
        sock.setsockopt(SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)
    except OSError:
        pass
    # Deep buffers: a burst of 64 KiB frames must not overflow them, or the
    # link would lose frames the spec did not ask to lose.
    sock.setsockopt(socket.SOL_SOCKET, 33, BUFFER_BYTES)  # SO_RCVBUFFORCE
    sock.setsockopt(socket.SOL_SOCKET, 32, BUFFER_BYTES)  # SO_SNDBUFFORCE
    sock.bind((interface, ETH_P_ALL))
    sock.setblocking(False)
    return sock


class Direction:
    """Frames read from one socket, waiting to be written to the other."""

    def __init__(self, source, sink, shape, rng):
        self.source, self.sink, self.shape, self.rng = source, sink, shape, rng
        self.waiting = collections.deque()  # (release time, frame), in order
        self.link_free = 0.0  # when the rate limit lets the next frame start

    def take(self, now):
        for _ in range(64):  # then let the other direction have a turn
            try:
                frame, address = self.source.recvfrom(FRAME_BYTES)
            except BlockingIOError:
                return
            except OSError:  # ENETDOWN while a link is set down: no frame
                return
            if address[2] == PACKET_OUTGOING:
                continue
            if self.rng.random() < self.shape["loss"] or len(self.waiting) >= QUEUE_LIMIT:
                continue
            release = now
            if self.shape["rate"]:
                # The 10-byte virtio header is not on the wire.
                start = max(now, self.link_free)
                self.link_free = start + (len(frame) - 10) * 8 / self.shape["rate"]
                release = self.link_free
            self.waiting.append((release + self.shape["delay"], frame))

    def give(self, now):
        while self.waiting and self.waiting[0][0] <= now:
            _, frame = self.waiting.popleft()
            try:
                self.sink.send(frame)
            except OSError:  # the link is down, or the sink is full: lost
                pass

    def next_release(self):
        return self.waiting[0][0] if self.waiting else None


def relay(a, b, spec):
    try:
        shape = parse(spec)
    except SpecError as error:
        print(f"error: {error}", flush=True)
        return 2
    first, second = open_socket(a), open_socket(b)
    rng = random.Random()
    directions = {
        first.fileno(): Direction(first, second, shape, rng),
        second.fileno(): Direction(second, first, shape, rng),
    }
    poller = select.poll()
    for fd in directions:
        poller.register(fd, select.POLLIN)
    print("ready", flush=True)
    while True:
        now = time.monotonic()
        for direction in directions.values():
            direction.give(now)
        releases = [r for r in (d.next_release() for d in directions.values()) if r is not None]
        # poll() counts whole milliseconds: round up so a frame is never early.
        timeout = None if not releases else max(0, int((min(releases) - now) * 1000) + 1)
        for fd, _ in poller.poll(timeout):
            directions[fd].take(time.monotonic())


def check():
    open_socket("lo").close()
    print("ready", flush=True)
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--check"]:
        sys.exit(check())
    if len(sys.argv) != 4:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(relay(sys.argv[1], sys.argv[2], sys.argv[3]))
