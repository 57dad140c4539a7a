"""TCP and UDP probes of the links between the hosts of a TestCluster.

  link_probe.py listen PORT READY          serve PORT until killed: a TCP connection is
                                           read to its end and answered with the byte
                                           count and SHA-256 of what came; a UDP datagram
                                           is echoed. Writes a line to READY (a FIFO) once
                                           it listens
  link_probe.py connect HOST PORT T        connect once with a T-second limit; prints the
                                           seconds it took, or exits 1 on failure
  link_probe.py transfer HOST PORT N T     send N bytes over TCP within T seconds; prints
                                           the seconds it took, or exits 1 when it failed
                                           or the listener got other bytes
  link_probe.py datagrams HOST PORT N      send N UDP datagrams at once; prints how many
                                           echoes came back before 1 s passed without one

Standard library only: it runs inside the cluster's network namespaces.
"""
import hashlib
import socket
import sys
import threading
import time


def echo(port):
    server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
    server.bind(("0.0.0.0", port))
    while True:
        datagram, sender = server.recvfrom(2048)
        server.sendto(datagram, sender)


def listen(port, ready):
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("0.0.0.0", port))
    server.listen(16)
    threading.Thread(target=echo, args=(port,), daemon=True).start()
    with open(ready, "w") as signal:
        signal.write("listening\n")
    while True:
        connection, _ = server.accept()
        digest, count = hashlib.sha256(), 0
        try:
            while chunk := connection.recv(1 << 20):
                digest.update(chunk)
                count += len(chunk)
            connection.sendall(f"{count} {digest.hexdigest()}".encode())
        except OSError:  # a connect probe that already went
            pass
        connection.close()


def connect(host, port, limit):
    start = time.monotonic()
    try:
        socket.create_connection((host, port), timeout=limit).close()
    except OSError as error:  # refused, timeout, unreachable
        print(f"{type(error).__name__}: {error}", file=sys.stderr)
        return 1
    print(f"{time.monotonic() - start:.4f}")
    return 0


def transfer(host, port, size, limit):
    data = bytes(i * 7 % 251 for i in range(size))
    start = time.monotonic()
    try:
        with socket.create_connection((host, port), timeout=limit) as connection:
            connection.sendall(data)
            connection.shutdown(socket.SHUT_WR)
            answer = b""
            while chunk := connection.recv(256):
                answer += chunk
    except OSError as error:
        print(f"{type(error).__name__}: {error}", file=sys.stderr)
        return 1
    expected = f"{size} {hashlib.sha256(data).hexdigest()}"
    if answer.decode() != expected:
        print(f"the listener got {answer.decode()!r}, not {expected!r}", file=sys.stderr)
        return 1
    print(f"{time.monotonic() - start:.4f}")
    return 0


def datagrams(host, port, count):
    sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sender.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
    sender.settimeout(1.0)
    for i in range(count):
        sender.sendto(i.to_bytes(4, "big"), (host, port))
    echoed = set()
    try:
        while len(echoed) < count:
            echoed.add(int.from_bytes(sender.recv(16), "big"))
    except socket.timeout:  # the rest were lost
        pass
    print(len(echoed))
    return 0


if __name__ == "__main__":
    mode, args = sys.argv[1], sys.argv[2:]
    if mode == "listen":
        listen(int(args[0]), args[1])
    elif mode == "connect":
        sys.exit(connect(args[0], int(args[1]), float(args[2])))
    elif mode == "transfer":
        sys.exit(transfer(args[0], int(args[1]), int(args[2]), float(args[3])))
    else:
        sys.exit(datagrams(args[0], int(args[1]), int(args[2])))
