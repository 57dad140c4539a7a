"""A plain torch.distributed program, as a Python user writes it: rendezvous
from the environment (env://), one all-reduce, and on rank 0 the addresses
the rendezvous store listens on (from /proc/net/tcp*)."""
import os
import socket
import struct

import torch
import torch.distributed as dist


def listening_addresses(port):
    found = []
    for table, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        try:
            lines = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.split(":")
            if state != "0A" or int(hex_port, 16) != port:  # 0A: LISTEN
                continue
            raw = bytes.fromhex(address)
            words = struct.unpack("<%dI" % (len(raw) // 4), raw)
            found.append(socket.inet_ntop(family, struct.pack(">%dI" % len(words), *words)))
    return sorted(set(found))


dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
print(f"rank {rank}/{world} sum {t.item()}", flush=True)
if rank == 0:
    print("store listens on " + ",".join(listening_addresses(int(os.environ["MASTER_PORT"]))),
          flush=True)
dist.destroy_process_group()
