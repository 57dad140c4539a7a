"""The demo's peer: the same GPT and training recipe as examples/gpt_addition,
in Python PyTorch, three ways:

    # one process (no distributed)
    .venv/bin/python bench/gpt_addition.py --max-steps 2000 --batch-size 128 --eval-every 100
    # PyTorch DDP over Gloo, 2 ranks under torchrun
    .venv/bin/python -m torch.distributed.run --standalone --nproc-per-node 2 \
        bench/gpt_addition.py --eval-every 100
    # HF Accelerate's Accelerator, 2 CPU processes (its torchrun path;
    # `--cpu --num_processes 2` would start one process without mpirun)
    .venv/bin/accelerate launch --multi_gpu --num_processes 2 --num_machines 1 \
        --mixed_precision no --dynamo_backend no bench/gpt_addition.py --accelerate --eval-every 100

--batch-size is the global batch; with WORLD_SIZE ranks each takes its share
of every batch (under DDP a slice of one shared shuffled order, under
Accelerate the prepared DataLoader's shard). Every rank evaluates the same
weights; rank 0 prints.

On one GPU (the GPU kit's comparison, scripts/gpu_kit.sh):

    python3 bench/gpt_addition.py --device cuda --mixed-precision bf16 --batch-size 128

Same model (pre-norm blocks, causal attention, GELU MLP, N(0, 0.02) init),
same data scheme (reversed answer digits, held-out pairs never trained on),
AdamW (weight decay 0.1) under the same DeepSpeed-style WarmupCosineLR
(linear warmup, cosine to 0.1 of the peak). Evaluation time is not counted
as training time. Prints one JSON line last:
  {"step", "loss", "accuracy", "tokens_per_s", "train_s", "time_to_target_s", "threads", ...}
with "peak_cuda_mb" (torch.cuda.max_memory_allocated) on a GPU.
"""
import argparse
import json
import math
import os
import random
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from bench_common import cosine_ratio

PLUS, EQUALS, VOCAB = 10, 11, 12


class Attention(nn.Module):
    def __init__(self, d, heads, block):
        super().__init__()
        self.heads, self.d = heads, d
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.register_buffer("mask", torch.full((block, block), float("-inf")).triu(1))

    def forward(self, x):
        b, t, _ = x.shape
        hd = self.d // self.heads
        q, k, v = self.qkv(x).split(self.d, dim=2)
        q, k, v = (y.view(b, t, self.heads, hd).transpose(1, 2) for y in (q, k, v))
        att = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(hd) + self.mask[:t, :t], -1)
        return self.proj((att @ v).transpose(1, 2).contiguous().view(b, t, self.d))


class Block(nn.Module):
    def __init__(self, d, heads, block):
        super().__init__()
        self.ln1, self.attn = nn.LayerNorm(d), Attention(d, heads, block)
        self.ln2, self.fc, self.out = nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class Gpt(nn.Module):
    def __init__(self, layers, heads, d, block):
        super().__init__()
        self.tok, self.pos = nn.Embedding(VOCAB, d), nn.Embedding(block, d)
        self.blocks = nn.ModuleList(Block(d, heads, block) for _ in range(layers))
        self.ln_f, self.head = nn.LayerNorm(d), nn.Linear(d, VOCAB)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if "ln" in name:
                    continue
                p.zero_() if "bias" in name else p.normal_(0.0, 0.02)

    def forward(self, tokens):
        x = self.tok(tokens) + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def encode(a, b, digits):
    digits_of = lambda v, w: [int(c) for c in str(v).zfill(w)]
    c = a + b
    return digits_of(a, digits) + [PLUS] + digits_of(b, digits) + [EQUALS] + \
        [(c // 10 ** i) % 10 for i in range(digits + 1)]


def make_data(digits, train_size, test_size, seed):
    rng = random.Random(seed)
    top = 10 ** digits
    held, prompts, answers = set(), [], []
    while len(held) < test_size:
        a, b = rng.randrange(top), rng.randrange(top)
        if (a, b) in held:
            continue
        held.add((a, b))
        t = encode(a, b, digits)
        prompts.append(t[:2 * digits + 2])
        answers.append(t[2 * digits + 2:])
    xs, ys = [], []
    while len(xs) < train_size:
        a, b = rng.randrange(top), rng.randrange(top)
        if (a, b) in held:
            continue
        t = encode(a, b, digits)
        xs.append(t[:-1])
        ys.append([t[i + 1] if i + 1 >= 2 * digits + 2 else -100 for i in range(len(t) - 1)])
    return (torch.tensor(xs), torch.tensor(ys)), (torch.tensor(prompts), torch.tensor(answers))


@torch.no_grad()
def accuracy(model, prompts, answers, autocast):
    model.eval()
    hits = 0
    device = next(model.parameters()).device
    for i in range(0, len(prompts), 500):
        seq = prompts[i:i + 500].to(device)
        for _ in range(answers.shape[1]):
            with autocast():
                logits = model(seq)
            seq = torch.cat([seq, logits[:, -1].argmax(-1, keepdim=True)], 1)
        hits += (seq[:, prompts.shape[1]:] == answers[i:i + 500].to(device)).all(1).sum().item()
    model.train()
    return hits / len(prompts)


class Trainer:
    """One training step and the model to evaluate, for one of the three ways to run."""

    def __init__(self, model, opt, x, y, a):
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        if a.batch_size % self.world:
            sys.exit(f"--batch-size {a.batch_size} does not split over {self.world} ranks")
        self.rank, self.model, self.opt, self.x, self.y = 0, model, opt, x, y
        self.batch = a.batch_size // self.world
        self.g = torch.Generator().manual_seed(a.seed)
        self.accelerator = None
        if a.accelerate:
            from accelerate import Accelerator
            from torch.utils.data import DataLoader, TensorDataset
            # cpu=True: Accelerate runs several CPU processes as MULTI_CPU over
            # Gloo only when told so (its own multi-CPU launch wants mpirun).
            self.accelerator = Accelerator(cpu=True)
            self.rank = self.accelerator.process_index
            loader = DataLoader(TensorDataset(x, y), batch_size=self.batch, shuffle=True,
                                generator=self.g, drop_last=True)
            # The scheduler stays outside prepare(): prepared, it would step once per
            # process per step, and the recipe counts optimizer steps.
            self.trained, self.opt, self.loader = self.accelerator.prepare(model, opt, loader)
            self.batches = iter(self.loader)
        elif self.world > 1:
            import torch.distributed as dist
            dist.init_process_group("gloo")
            self.rank = dist.get_rank()
            self.trained = nn.parallel.DistributedDataParallel(model)
        else:
            self.trained = model
        self.order, self.pos = torch.randperm(len(x), generator=self.g), 0
        self.device = torch.device(a.device)
        # bf16 autocast on the model's device, as tandem's accelerator.autocast().
        self.autocast = lambda: torch.autocast(self.device.type, dtype=torch.bfloat16,
                                               enabled=a.mixed_precision == "bf16")

    def next_batch(self):
        if self.accelerator:
            try:
                return next(self.batches)
            except StopIteration:
                self.batches = iter(self.loader)
                return next(self.batches)
        size = self.batch * self.world
        if self.pos + size > len(self.x):
            self.order, self.pos = torch.randperm(len(self.x), generator=self.g), 0
        idx = self.order[self.pos + self.rank * self.batch:self.pos + (self.rank + 1) * self.batch]
        self.pos += size
        return self.x[idx], self.y[idx]

    def step(self):
        xb, yb = self.next_batch()
        if self.accelerator is None:
            xb = xb.to(self.device, non_blocking=True)
            yb = yb.to(self.device, non_blocking=True)
        self.opt.zero_grad()
        with self.autocast():
            out = F.cross_entropy(self.trained(xb).view(-1, VOCAB), yb.reshape(-1),
                                  ignore_index=-100)
        if self.accelerator:
            self.accelerator.backward(out)
        else:
            out.backward()
        self.opt.step()
        return out

    def finish(self):
        if self.accelerator:
            self.accelerator.end_training()
        elif self.world > 1:
            import torch.distributed as dist
            dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--max-steps", type=int, default=2000)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--digits", type=int, default=3)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup-steps", type=int, default=100)
    p.add_argument("--n-layer", type=int, default=2)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--n-embd", type=int, default=128)
    p.add_argument("--train-size", type=int, default=1 << 18)
    p.add_argument("--test-size", type=int, default=2000)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--target", type=float, default=0.98)
    p.add_argument("--threads", type=int, default=0, help="intra-op threads (0: torch's default)")
    p.add_argument("--stop-at-target", action="store_true")
    p.add_argument("--device", default="cpu", help="cpu or cuda (one GPU, one process)")
    p.add_argument("--mixed-precision", choices=["no", "bf16"], default="no",
                   help="bf16 autocast for forward and loss, as tandem launch --mixed-precision")
    p.add_argument("--accelerate", action="store_true",
                   help="train through accelerate.Accelerator (start with accelerate launch)")
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    (x, y), (prompts, answers) = make_data(a.digits, a.train_size, a.test_size, a.seed)
    model = Gpt(a.n_layer, a.n_head, a.n_embd, 3 * a.digits + 3).to(a.device)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda k: cosine_ratio(k - 1, a.warmup_steps, a.max_steps, 0.1))
    trainer = Trainer(model, opt, x, y, a)
    report = sys.stderr if trainer.rank == 0 else open(os.devnull, "w")
    step, train_s, tokens, loss, acc, to_target = 0, 0.0, 0, float("nan"), 0.0, None
    clock = time.perf_counter()
    while step < a.max_steps:
        out = trainer.step()
        sched.step()
        step += 1
        tokens += a.batch_size * x.shape[1]
        if step % a.eval_every == 0 or step == a.max_steps:
            loss = out.item()
            train_s += time.perf_counter() - clock
            acc = accuracy(model, prompts, answers, trainer.autocast)
            print(json.dumps({"step": step, "loss": loss, "accuracy": acc, "train_s": train_s}),
                  file=report, flush=True)
            if to_target is None and acc >= a.target:
                to_target = train_s
                if a.stop_at_target:
                    break
            clock = time.perf_counter()
    trainer.finish()
    if trainer.rank == 0:
        result = {"step": step, "loss": loss, "accuracy": acc,
                  "tokens_per_s": tokens / train_s, "train_s": train_s,
                  "time_to_target_s": to_target, "threads": torch.get_num_threads(),
                  "world": trainer.world, "accelerate": a.accelerate,
                  "device": a.device, "mixed_precision": a.mixed_precision}
        if trainer.device.type == "cuda":
            result["peak_cuda_mb"] = torch.cuda.max_memory_allocated() / 2 ** 20
        print(json.dumps(result))


if __name__ == "__main__":
    main()
