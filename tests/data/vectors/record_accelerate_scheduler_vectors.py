#!/usr/bin/env python3
"""Records the learning rates HF Accelerate's prepared scheduler gives.

tests/accelerate/test_scheduler_stepping.cpp checks tandem's prepared
scheduler against accelerate_scheduler.json: the same loop at 2 processes
must see the same learning rate after every micro-step.

How: 2 processes (torch.multiprocessing, Gloo on loopback) each build
Accelerator(cpu=True, gradient_accumulation_steps=2) with split_batches off
and on, prepare Linear(2, 1), SGD(lr=1.0) and DeepSpeed's WarmupLR
(warmup_min_lr 0, warmup_max_lr 1, 16 linear warmup steps; tandem::WarmupLR
is its port: LibTorch's StepLR decays one step later than Python's), and
run 10 micro-steps of
    with accelerator.accumulate(model):
        accelerator.backward(model(x).sum()); optimizer.step();
        scheduler.step(); optimizer.zero_grad()
recording param_groups[0]["lr"] after each (rank 0's; every rank agrees).

Run with the pip torch and accelerate in .venv/ (scripts/setup.sh):
    .venv/bin/python tests/data/vectors/record_accelerate_scheduler_vectors.py
It rewrites accelerate_scheduler.json next to itself.
"""

import json
import os
import socket
import tempfile

import torch
import torch.multiprocessing as mp

WORLD, STEPS, ACCUMULATION = 2, 10, 2


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_rank(rank, port, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(WORLD), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(WORLD))
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState
    from accelerate.utils import DataLoaderConfiguration

    result = {}
    for split in (False, True):
        AcceleratorState._reset_state(True)
        GradientState._reset_state()
        accelerator = Accelerator(cpu=True, gradient_accumulation_steps=ACCUMULATION,
                                  dataloader_config=DataLoaderConfiguration(split_batches=split))
        torch.manual_seed(0)
        model = torch.nn.Linear(2, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
        from deepspeed.runtime.lr_schedules import WarmupLR
        scheduler = WarmupLR(optimizer, warmup_min_lr=0.0, warmup_max_lr=1.0,
                             warmup_num_steps=16, warmup_type="linear")
        model, optimizer = accelerator.prepare(model, optimizer)
        scheduler = accelerator.prepare_scheduler(scheduler)
        lrs = []
        for _ in range(STEPS):
            with accelerator.accumulate(model):
                accelerator.backward(model(torch.ones(4, 2)).sum())
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            lrs.append(optimizer.param_groups[0]["lr"])
        result["split_batches" if split else "default"] = lrs
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)


def main():
    with tempfile.TemporaryDirectory() as out_dir:
        mp.spawn(run_rank, args=(free_port(), out_dir), nprocs=WORLD, join=True)
        with open(os.path.join(out_dir, "rank0.json")) as f:
            result = json.load(f)
    import accelerate
    result.update(accelerate=accelerate.__version__, world=WORLD, steps=STEPS,
                  gradient_accumulation_steps=ACCUMULATION)
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "accelerate_scheduler.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
