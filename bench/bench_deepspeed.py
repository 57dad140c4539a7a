"""Training step and per-rank memory under DeepSpeed ZeRO 1-3 on the CPU over Gloo: a third column for compare_zero.py.

A rank program for torchrun, measuring exactly as bench_zero.py does (same
model, batch, loss, Adam lr, warmup/steps protocol and RSS figures, imported
from it), but trained through deepspeed.initialize:

    .venv/bin/python -m torch.distributed.run --standalone --nproc-per-node 2 \\
        bench/bench_deepspeed.py --stage 2 --width 2048 --depth 8 --batch 32 --steps 10

DeepSpeed runs with its CPU accelerator (DS_ACCELERATOR=cpu, set here unless
already set) and `deepspeed.init_distributed(dist_backend="gloo")`, fp32
throughout (no fp16/bf16 section). The optimizer is the peer's
torch.optim.Adam(lr=1e-3) handed to deepspeed.initialize; with --offload,
ZeRO's offload_optimizer to the CPU needs DeepSpeed's own optimizer, so it is
DeepSpeedCPUAdam(lr=1e-3, adamw_mode=False) (a JIT-built C++ op, built on
first use into ~/.cache/torch_extensions). reduce_bucket_size and
allgather_bucket_size are --bucket-mb MiB of fp32; every other ZeRO option
is DeepSpeed's default. The step is `engine(x)`, cross-entropy,
`loss.backward()` (with a ZeRO optimizer DeepSpeed 0.19 hooks a plain
backward the way `engine.backward(loss)` does; fp32 has no loss scaling) and
`engine.step()`, timed by bench_zero.time_steps.

model_state_bytes counts, once per storage, the tensors this rank holds for
the model after the timed steps and one more forward and backward (DeepSpeed's
step frees the stage 1-2 gradients that the other sides keep, so they are
counted where they are held): the module's parameters (for stage 3 the
partition `ds_tensor`, and the small parameters it keeps whole), their .grad,
the tensors the ZeRO optimizer keeps in its attributes (flat parameter and
gradient buffers, the fp32 master partition: DeepSpeed keeps one even in
fp32 training, 4Ψ/N more than ZeRO's formula), and the Adam state. It is a
lower bound: buffers behind other objects are not walked.
The last line is JSON, with the keys bench_zero.py prints.
"""
import argparse
import json
import os
import types
import warnings

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import deepspeed  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from bench_zero import (memory_per_rank, proc_status_bytes, reset_peak_rss,  # noqa: E402
                        result, return_free_memory, start_rank, time_steps)

MiB = 1 << 20

# DeepSpeed steps call all_gather_into_tensor and reduce_scatter_tensor,
# which torch 2.13 deprecates; at stage 3 each call prints a FutureWarning.
warnings.filterwarnings("ignore", category=FutureWarning,
                        message=r"`torch\.distributed\.\w+` is deprecated")


def ds_config(args):
    bucket = int(args.bucket_mb * MiB / 4)  # DeepSpeed counts bucket sizes in elements
    zero = {"stage": args.stage, "reduce_bucket_size": bucket, "allgather_bucket_size": bucket}
    if args.offload:
        zero["offload_optimizer"] = {"device": "cpu"}
    return {"train_micro_batch_size_per_gpu": args.batch, "gradient_accumulation_steps": 1,
            "zero_optimization": zero, "zero_allow_untested_optimizer": True,
            "steps_per_print": 1 << 30, "wall_clock_breakdown": False}


def make_optimizer(params, offload):
    if offload:
        from deepspeed.ops.adam import DeepSpeedCPUAdam
        return DeepSpeedCPUAdam(params, lr=1e-3, adamw_mode=False)
    return torch.optim.Adam(params, lr=1e-3)


def tensors_in(value, depth=2):
    """The tensors in `value` and in the lists, tuples and dicts inside it."""
    if torch.is_tensor(value):
        yield value
    elif depth > 0 and isinstance(value, (list, tuple)):
        for item in value:
            yield from tensors_in(item, depth - 1)
    elif depth > 0 and isinstance(value, dict):
        for item in value.values():
            yield from tensors_in(item, depth - 1)


# Where DeepSpeed's ZeRO optimizers keep this rank's fp32 master partition
# (stages 1-2, stage 3): optimizer state, though the inner optimizer holds it
# only while it steps.
FP32_MASTER_ATTRS = ("single_partition_of_fp32_groups", "fp32_partitioned_groups_flat")


def model_state_bytes(module, zero_optimizer):
    """(parameter, gradient, optimizer) bytes this rank holds, each storage counted once."""
    seen = set()

    def count(tensors):
        total = 0
        for t in tensors:
            storage = t.untyped_storage()
            # Meta tensors (shape records, no memory) all share data_ptr 0.
            if t.device.type != "meta" and storage.nbytes() and storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                total += storage.nbytes()
        return total

    params = list(module.parameters())
    # Stage 3: the partition (ds_tensor), and the full tensor where it is kept
    # (parameters under the persistence threshold); a released one is empty.
    parameter_bytes = count(t for p in params for t in (p, getattr(p, "ds_tensor", p)))
    inner = getattr(zero_optimizer, "optimizer", zero_optimizer)
    optimizer_bytes = count(p for group in inner.param_groups for p in group["params"])
    optimizer_bytes += count(t for name in FP32_MASTER_ATTRS
                             for t in tensors_in(getattr(zero_optimizer, name, None)))
    optimizer_bytes += count(tensors_in(inner.state))
    # What else the wrapper holds is gradient storage (flat averaged
    # gradients, partitions, reduction buffers) or already counted.
    gradient_bytes = count(p.grad for p in params if p.grad is not None)
    gradient_bytes += count(t for value in vars(zero_optimizer).values() for t in tensors_in(value))
    return parameter_bytes, gradient_bytes, optimizer_bytes


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stage", type=int, choices=(1, 2, 3), default=1, help="ZeRO stage")
    parser.add_argument("--offload", action="store_true",
                        help="offload_optimizer to the CPU (DeepSpeedCPUAdam)")
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=15, help="timed steps")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps")
    parser.add_argument("--bucket-mb", type=float, default=25.0,
                        help="reduce/allgather bucket size, MiB of fp32")
    args = parser.parse_args()

    rank, world, baseline_rss, inputs, labels, model = start_rank(
        args, lambda: deepspeed.init_distributed(dist_backend="gloo", verbose=False))
    params = sum(p.numel() for p in model.parameters())
    engine, zero_optimizer, _, _ = deepspeed.initialize(
        model=model, optimizer=make_optimizer(model.parameters(), args.offload),
        config=ds_config(args))

    dist.barrier()
    setup_peak_rss = proc_status_bytes("VmHWM")
    return_free_memory()
    peak_reset = reset_peak_rss()

    # time_steps calls optimizer.zero_grad() and .step(): route both to the engine.
    step = time_steps(engine, types.SimpleNamespace(zero_grad=engine.zero_grad, step=engine.step),
                      inputs, labels, args)
    loop_peak_rss = proc_status_bytes("VmHWM")
    end_rss = proc_status_bytes("VmRSS")

    # DeepSpeed's step frees the gradients (stages 1-2) that DDP and
    # ZeroRedundancyOptimizer keep; count them where they are held, after
    # one more forward and backward (no step).
    F.cross_entropy(engine(inputs), labels).backward()
    parameter_bytes, gradient_bytes, optimizer_bytes = model_state_bytes(model, zero_optimizer)
    mine = [parameter_bytes + gradient_bytes + optimizer_bytes, parameter_bytes, gradient_bytes,
            optimizer_bytes, baseline_rss, max(setup_peak_rss, loop_peak_rss), setup_peak_rss,
            loop_peak_rss, end_rss]
    per_rank = memory_per_rank(mine, rank, world)
    if rank == 0:
        adam = "DeepSpeedCPUAdam" if args.offload else "torch.optim.Adam"
        line = result(args, "deepspeed", f"deepspeed ZeRO-{args.stage}({adam})", args.offload,
                      params, step, per_rank, peak_reset)
        line["deepspeed"] = deepspeed.__version__
        print(json.dumps(line), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
