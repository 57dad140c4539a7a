"""The Python side of the DeepSpeed resume test: a run trained with the real
DeepSpeed (ZeRO stage N, 2 CPU ranks over gloo) that saves a checkpoint
folder and then continues, and what it continued to.

  run [world=N] DIR STAGE [DIR STAGE ...]
                     for each DIR (STAGE: 1, 2 or 3, then bf16 for bf16
                     or sgd for a client torch.optim.SGD with momentum):
                     DIR/data.safetensors     the batches of every step
                                              (x: [steps, 6, 5], y: [steps, 6])
                     DIR/ds/                  DeepSpeed's checkpoint after
                                              SAVE_AT steps (client_sd
                                              {"epoch": 4, "best": 0.25})
                     DIR/continued.safetensors the parameters after all
                                              steps, and each step's loss

Every run of one call trains in the same torchrun ranks, one after the
other, each with a fresh model, engine and seed: importing torch and
DeepSpeed takes most of a run's CPU time, so the tests ask for all the runs
of one world size at once.

The model has odd sizes, a frozen layer and a tied weight (DeepSpeed's
frozen_param_fragments and shared_params); the optimizer has two param
groups (biases without weight decay). Each step's global batch is 6
rows; rank r of the 2 takes rows [3r, 3r + 3), so any world that splits the
same 6 rows evenly (1, 2, 3) computes the same averaged gradient. world=3
runs DeepSpeed on 3 ranks (2 rows each) instead.
"""
import os
import shutil
import subprocess
import sys

import torch

STEPS = 8
SAVE_AT = 3


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Linear(5, 7)
        self.frozen = torch.nn.Linear(7, 7)
        self.hidden = torch.nn.Linear(7, 7, bias=False)
        self.tied = torch.nn.Linear(7, 7, bias=False)
        self.tied.weight = self.hidden.weight  # one parameter, two names
        self.head = torch.nn.Linear(7, 3)
        for p in self.frozen.parameters():
            p.requires_grad_(False)

    def forward(self, x):
        h = torch.relu(self.embed(x))
        h = torch.tanh(self.frozen(h))
        h = torch.relu(self.hidden(h))
        h = torch.tanh(self.tied(h))
        return self.head(h)


def config(stage, world, bf16=False, sgd=False):
    settings = {
        "bf16": {"enabled": bf16},
        "train_micro_batch_size_per_gpu": 6 // world,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 0.2,  # below these gradients' norms, so it acts
        "steps_per_print": 1000,
        "optimizer": {"type": "AdamW",
                      "params": {"lr": 1e-2, "betas": [0.8, 0.95], "eps": 1e-7,
                                 "weight_decay": 0.05, "torch_adam": True}},
        "scheduler": {"type": "WarmupLR",
                      "params": {"warmup_min_lr": 1e-3, "warmup_max_lr": 2e-2,
                                 "warmup_num_steps": 5, "warmup_type": "linear"}},
        "zero_optimization": {"stage": stage},
    }
    if sgd:
        # The program's own optimizer (no per-parameter step count).
        del settings["optimizer"]
        settings["zero_allow_untested_optimizer"] = True
    return settings


def train(directory, stage, variant, rank, world):
    import deepspeed
    bf16, sgd = variant == "bf16", variant == "sgd"
    rows = 6 // world
    torch.manual_seed(0)
    model = Model()
    data = torch.Generator().manual_seed(1)
    xs = torch.randn(STEPS, 6, 5, generator=data)
    ys = torch.randint(0, 3, (STEPS, 6), generator=data)
    # Two param groups, as HF scripts build them: no weight decay on biases.
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    groups = [{"params": [p for n, p in trainable if not n.endswith("bias")]},
              {"params": [p for n, p in trainable if n.endswith("bias")], "weight_decay": 0.0}]
    optimizer = None
    if sgd:
        optimizer = torch.optim.SGD(groups, lr=1e-2, momentum=0.9, weight_decay=0.05)
        groups = None
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=groups,
                                           optimizer=optimizer,
                                           config=config(stage, world, bf16, sgd))
    losses = []
    for step in range(STEPS):
        x, y = xs[step, rows * rank:rows * (rank + 1)], ys[step, rows * rank:rows * (rank + 1)]
        if bf16:
            x = x.to(torch.bfloat16)
        loss = torch.nn.functional.cross_entropy(engine(x), y)
        engine.backward(loss)
        engine.step()
        mean = loss.detach().clone()
        torch.distributed.all_reduce(mean)
        losses.append(mean.float().item() / world)
        if step + 1 == SAVE_AT:
            engine.save_checkpoint(os.path.join(directory, "ds"),
                                   client_state={"epoch": 4, "best": 0.25})
    if stage == 3:
        with deepspeed.zero.GatheredParameters(list(engine.module.parameters())):
            final = {n: p.detach().clone() for n, p in engine.module.named_parameters()}
    else:
        final = {n: p.detach().clone() for n, p in engine.module.named_parameters()}
    if rank == 0:
        from safetensors.torch import save_file
        # Tied: one tensor under its first name (the test compares that one).
        final.pop("tied.weight", None)
        final["losses"] = torch.tensor(losses, dtype=torch.float64)
        save_file({k: v.float().contiguous() if v.is_floating_point() and k != "losses" else v
                   for k, v in final.items()},
                  os.path.join(directory, "continued.safetensors"))
        save_file({"x": xs, "y": ys}, os.path.join(directory, "data.safetensors"))
    torch.distributed.barrier()


def parse_runs(words):
    """[DIR, STAGE, DIR, STAGE, ...] -> [(DIR, stage, variant), ...]"""
    if not words or len(words) % 2:
        sys.exit(f"deepspeed_resume_reference: expected DIR STAGE pairs, got {words}")
    return [(d, int(s[0]), s[1:]) for d, s in zip(words[::2], words[1::2])]


def rank_main(runs):
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    for directory, stage, variant in parse_runs(runs):
        train(directory, stage, variant, rank, world)
    # A rank that leaves with its process group alive can die in the group's
    # threads at exit ("terminate called without an active exception"),
    # failing the whole run once in a dozen; with the group destroyed first
    # it still did once in CI (2026-11-29). Every output is written before
    # the last barrier, so each rank leaves without the interpreter's
    # teardown, where those threads and DeepSpeed's objects are destroyed.
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run(runs, world=2):
    parse_runs(runs)
    # --standalone: torchrun picks a free port for its store.
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", str(world), os.path.abspath(__file__), "rank", *runs]
    # The peer's own rare crash (a rank aborting in its process group's
    # threads, above) is the peer's, not what the tests check: one more
    # launch, saying so. A run that fails twice fails the test.
    first = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if first.returncode != 0:
        print(f"deepspeed_resume_reference: the launch failed (exit {first.returncode}); "
              f"launching once more. Its last lines:\n" + "\n".join(first.stderr.splitlines()[-15:]),
              file=sys.stderr, flush=True)
        for directory in runs[::2]:  # nothing of the first launch stays
            for entry in os.listdir(directory):
                path = os.path.join(directory, entry)
                shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    for directory in runs[::2]:
        print("ok", directory, sorted(os.listdir(directory)))


if __name__ == "__main__":
    if sys.argv[1] == "rank":
        rank_main(sys.argv[2:])
    elif sys.argv[1] == "run":
        args = sys.argv[2:]
        world = 2
        if args and args[0].startswith("world="):
            world = int(args.pop(0).split("=")[1])
        run(args, world)
    else:
        sys.exit(__doc__)
