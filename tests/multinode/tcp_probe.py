"""TCP reachability and round trips between the hosts of a TestCluster.

  tcp_probe.py listen PORT READY      accept and close connections until killed;
                                      writes a line to READY (a FIFO) once it listens
  tcp_probe.py connect HOST PORT T    connect once with a T-second limit; prints the
                                      seconds it took, or exits 1 on failure

Standard library only: it runs inside the cluster's network namespaces.
"""
import socket
import sys
import time


def listen(port, ready):
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("0.0.0.0", port))
    server.listen(16)
    with open(ready, "w") as signal:
        signal.write("listening\n")
    while True:
        connection, _ = server.accept()
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


if __name__ == "__main__":
    if sys.argv[1] == "listen":
        listen(int(sys.argv[2]), sys.argv[3])
    else:
        sys.exit(connect(sys.argv[2], int(sys.argv[3]), float(sys.argv[4])))
