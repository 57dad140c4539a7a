"""TCP reachability and round trips between the hosts of a TestCluster.

  tcp_probe.py listen PORT            accept and close connections until killed
  tcp_probe.py connect HOST PORT T    connect with a T-second limit; prints the
                                      seconds it took, or exits 1 on failure

Standard library only: it runs inside the cluster's network namespaces.
"""
import socket
import sys
import time


def listen(port):
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("0.0.0.0", port))
    server.listen(16)
    print("listening", flush=True)
    while True:
        connection, _ = server.accept()
        connection.close()


def connect(host, port, limit):
    deadline = time.monotonic() + limit
    while True:  # the listener may still be starting: retry refusals until the limit
        start = time.monotonic()
        try:
            socket.create_connection((host, port), timeout=max(0.05, deadline - start)).close()
            print(f"{time.monotonic() - start:.4f}")
            return 0
        except ConnectionRefusedError:
            if time.monotonic() >= deadline:
                return 1
            time.sleep(0.05)
        except OSError as error:  # timeout, unreachable
            print(f"{type(error).__name__}: {error}", file=sys.stderr)
            return 1


if __name__ == "__main__":
    if sys.argv[1] == "listen":
        listen(int(sys.argv[2]))
    else:
        sys.exit(connect(sys.argv[2], int(sys.argv[3]), float(sys.argv[4])))
