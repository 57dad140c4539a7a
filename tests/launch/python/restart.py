"""Fails on rank 0 in attempt 0, after the rendezvous; attempt 1 all-reduces.
The restarted group must rendezvous again from scratch."""
import os
import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
if rank == 0 and attempt == "0":
    sys.exit(3)
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
print(f"attempt {attempt} rank {rank} sum {t.item()}", flush=True)
# Leaving without destroy_process_group can abort in Gloo's teardown
# ("terminate called without an active exception"); seen once in 5 runs.
dist.destroy_process_group()
