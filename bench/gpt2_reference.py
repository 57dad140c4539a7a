"""GPT-2 training throughput in plain PyTorch: the peer of examples/gpt2, one
case per process (bench/compare_gpt2.py runs them all side by side):

    .venv/bin/python bench/gpt2_reference.py --case eager --preset tiny --max-steps 20
    python3 bench/gpt2_reference.py --case cuda-graph --preset 124m --device cuda \
        --mixed-precision bf16 --batch-size 16 --data fineweb_train_000001.bin

Cases: eager; compile (torch.compile); reduce-overhead (torch.compile's CUDA
graphs of forward and backward; on a CPU, inductor alone); cuda-graph (one
torch.cuda.graph of the whole step, capturable fused AdamW included; CUDA only).

The recipe, which the C++ example follows:
- model: nanoGPT's GPT-2 (pre-norm blocks, biases, SDPA causal attention,
  tanh GELU), logits = ln_f(x) @ wte.weight.T (tied), loss = cross_entropy of
  the logits in the autocast dtype. Init, as the C++ model's init_weights():
  torch.manual_seed(--seed), the modules built on the CPU, then in
  named_parameters() order N(0, 0.02), c_proj weights N(0, 0.02/sqrt(2L)),
  biases 0, LayerNorm 1/0; then moved to the device.
- AdamW(betas (0.9, 0.95), eps 1e-8, weight decay 0.1 on every parameter; fused
  on CUDA), clip_grad_norm_(1.0) every step, loss / A over A micro-batches.
- lr: tandem's WarmupCosineLR (DeepSpeed's; linear warmup over K = max(2,
  --warmup-steps), cosine to 0.1 over the whole run, W + --max-steps steps):
  optimizer step k (0-based) runs at lr * ratio(k - 1), see lr_ratio().
- data: uint16 tokens (llm.c's .bin: a 1024-byte header when the first int32 is
  20240520); micro-batch i = s*A + m reads tokens[o : o + B*T + 1],
  o = (i*B*T) % (N - B*T - 1); x its first B*T as [B, T], y the same shifted by
  one. Without --data, synthetic tokens from make_tokens().

Timing: --warmup-measure W steps untimed, then --max-steps timed between two
torch.cuda.synchronize(). compile_s: the untimed steps' time beyond W ordinary
steps (compilation, graph recording or capture). MFU: (6N + 12LCT) FLOPs per
token (N without wpe) over PEAK_BF16_TFLOPS or --peak-tflops. Prints one JSON
line last, the C++ example's keys ("losses": every step, the untimed first).
"""
import argparse
import json
import math
import re
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from bench_common import cosine_ratio

PRESETS = {
    "tiny": dict(n_layer=2, n_head=4, n_embd=128, block_size=64, vocab_size=512),
    "small": dict(n_layer=6, n_head=6, n_embd=384, block_size=256, vocab_size=50304),
    "124m": dict(n_layer=12, n_head=12, n_embd=768, block_size=1024, vocab_size=50304),
}
DEFAULT_BATCH = {"tiny": 32, "small": 32, "124m": 16}
CASES = ("eager", "compile", "reduce-overhead", "cuda-graph")
# Dense bf16 tensor-core TFLOP/s by device name, first match wins.
PEAK_BF16_TFLOPS = ((r"H100.*PCIe", 756.0), (r"H100 NVL", 835.0), (r"H100", 989.0),
                    (r"H200", 989.0), (r"A100", 312.0), (r"\bL4\b", 121.0))
LLMC_MAGIC = 20240520


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.n_head = n_head
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))


class Mlp(nn.Module):
    def __init__(self, n_embd):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.c_proj = nn.Linear(4 * n_embd, n_embd)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.ln_1, self.attn = nn.LayerNorm(n_embd), CausalSelfAttention(n_embd, n_head)
        self.ln_2, self.mlp = nn.LayerNorm(n_embd), Mlp(n_embd)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Gpt2(nn.Module):
    def __init__(self, n_layer, n_head, n_embd, block_size, vocab_size):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.h = nn.ModuleList(Block(n_embd, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        # The C++ model's draws, in its order, from the global generator after
        # the constructors' own (LibTorch's modules take the same numbers).
        with torch.no_grad():
            for name, p in self.named_parameters():
                if "ln_" in name:
                    continue
                if name.endswith("bias"):
                    p.zero_()
                else:
                    p.normal_(0.0, 0.02 / math.sqrt(2 * n_layer) if "c_proj.weight" in name
                              else 0.02)

    def forward(self, idx, targets):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def synthetic_tokens(n, vocab, seed):
    """n uint16 tokens: per 64-token segment an arithmetic progression mod
    vocab with a random start and stride 1-16, which a model can learn."""
    rng = np.random.default_rng(seed)
    start = rng.integers(0, vocab, size=(-(-n // 64), 1))
    stride = rng.integers(1, 17, size=start.shape)
    return ((start + stride * np.arange(64)) % vocab).reshape(-1)[:n].astype(np.uint16)


def make_tokens(path, n, vocab, seed):
    """Writes synthetic_tokens(n, vocab, seed) to `path`, a raw uint16 file."""
    synthetic_tokens(n, vocab, seed).tofile(path)


def load_tokens(path):
    """The uint16 tokens of `path` (raw, or llm.c's .bin with its 1024-byte header)."""
    data = np.memmap(path, dtype=np.uint16, mode="r")
    if len(data) >= 512 and int(data[:2].view(np.int32)[0]) == LLMC_MAGIC:
        count = int(data[:512].view(np.int32)[2])
        return data[512:512 + count]
    return data


class Batches:
    """Micro-batch i of B x T tokens, as the C++ example reads them."""

    def __init__(self, tokens, batch, block, device):
        self.tokens, self.bt, self.batch, self.block = tokens, batch * block, batch, block
        self.device = device
        if len(tokens) <= self.bt + 1:
            sys.exit(f"{len(tokens)} tokens: need more than B*T + 1 = {self.bt + 1}")

    def host(self, i):
        """Micro-batch i's B*T + 1 tokens as int64 on the host (pinned for CUDA)."""
        o = (i * self.bt) % (len(self.tokens) - self.bt - 1)
        chunk = torch.from_numpy(self.tokens[o:o + self.bt + 1].astype(np.int64))
        return chunk.pin_memory() if self.device.type == "cuda" else chunk

    def get(self, i):
        """(x, y) of micro-batch i on the device."""
        chunk = self.host(i).to(self.device, non_blocking=True)
        return chunk[:-1].view(self.batch, self.block), chunk[1:].view(self.batch, self.block)


def lr_ratio(iteration, warmup, total, floor=0.1):
    """tandem's WarmupCosineLR ratio (DeepSpeed's, linear warmup) after
    `iteration` (-1: before the first step, so the first step runs at lr 0)."""
    return cosine_ratio(iteration, max(2, warmup), total, floor)


def peak_tflops(device, given):
    if given:
        return given
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((tf for pattern, tf in PEAK_BF16_TFLOPS if re.search(pattern, name)), None)


def make_step(case, model, opt, sched, batches, losses, a, autocast):
    """Returns step(s): optimizer step s (0-based), its loss into losses[s]."""
    params = list(model.parameters())
    A = a.accumulation
    if case != "cuda-graph":
        forward = model
        if case != "eager":
            forward = torch.compile(model, mode="reduce-overhead" if case == "reduce-overhead"
                                    else None)

        def step(s):
            for m in range(A):
                x, y = batches.get(s * A + m)
                if case == "reduce-overhead":
                    torch.compiler.cudagraph_mark_step_begin()
                with autocast():
                    loss = forward(x, y)
                (loss / A).backward()
                losses[s] += loss.detach() / A
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
        return step

    # The whole step in one graph: static inputs, the gradients allocated by the
    # first backward inside the capture (so each replay overwrites, then
    # accumulates them), lr a device tensor that the scheduler fills in place.
    dev = batches.device
    static_x = torch.zeros(A, a.batch_size, batches.block, dtype=torch.long, device=dev)
    static_y = torch.zeros_like(static_x)

    def load(s):
        for m in range(A):
            chunk = batches.host(s * A + m)
            static_x[m].copy_(chunk[:-1].view_as(static_x[m]), non_blocking=True)
            static_y[m].copy_(chunk[1:].view_as(static_y[m]), non_blocking=True)

    def body():
        total = torch.zeros((), device=dev)
        for m in range(A):
            with autocast():
                loss = model(static_x[m], static_y[m])
            (loss / A).backward()
            total += loss.detach() / A
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        return total

    graph, static_loss = torch.cuda.CUDAGraph(), None

    def step(s):
        nonlocal static_loss
        if static_loss is None and s < a.warmup_measure - 1:
            # Eager warm-up on a side stream, as torch.cuda.graph asks; these
            # are real training steps.
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                load(s)
                opt.zero_grad(set_to_none=True)
                losses[s].copy_(body())
                sched.step()
            torch.cuda.current_stream().wait_stream(side)
            return
        if static_loss is None:
            opt.zero_grad(set_to_none=True)
            with torch.cuda.graph(graph):
                static_loss = body()
        load(s)
        graph.replay()
        losses[s].copy_(static_loss)
        sched.step()
    return step


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--case", choices=CASES, default="eager")
    p.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    for key in PRESETS["tiny"]:
        p.add_argument("--" + key.replace("_", "-"), type=int, help="overrides the preset")
    p.add_argument("--batch-size", type=int, help="micro-batch B (default per preset: "
                   + ", ".join(f"{k} {v}" for k, v in DEFAULT_BATCH.items()) + ")")
    p.add_argument("--accumulation", type=int, default=1, help="micro-batches per step")
    p.add_argument("--max-steps", type=int, default=50, help="timed optimizer steps")
    p.add_argument("--warmup-measure", type=int, default=5, help="untimed steps first")
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument("--warmup-steps", type=int, default=10)
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--data", help="uint16 token file (default: synthetic tokens)")
    p.add_argument("--device", choices=["cpu", "cuda"],
                   default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--mixed-precision", choices=["no", "bf16"],
                   help="bf16 autocast (default: bf16 on cuda, no on cpu)")
    p.add_argument("--peak-tflops", type=float, help="device peak for MFU (default: table)")
    p.add_argument("--threads", type=int, default=0, help="intra-op threads (0: torch's)")
    p.add_argument("--losses", action="store_true", help="put every step's loss in the JSON")
    p.add_argument("--profile", help="after the timed steps, profile 3 more and write the "
                   "kernels' time table (torch.profiler, by total device time) to FILE")
    a = p.parse_args(argv)
    a.model = {k: getattr(a, k) or v for k, v in PRESETS[a.preset].items()}
    a.batch_size = a.batch_size or DEFAULT_BATCH[a.preset]
    a.mixed_precision = a.mixed_precision or ("bf16" if a.device == "cuda" else "no")
    return a


def write_profile(path, step, total_steps, device, sync):
    """Where a step's time goes: 3 steps (repeating the last batches'
    indices) under torch.profiler, kernels by total device time."""
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda"
                                           else [])
    with profile(activities=activities) as prof:
        for s in range(total_steps - 3, total_steps):
            step(s)
        sync()
    key = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    with open(path, "w") as out:
        out.write(prof.key_averages().table(sort_by=key, row_limit=40))


def main(argv=None):
    a = parse_args(argv)
    if a.case == "cuda-graph" and a.device != "cuda":
        print(json.dumps({"case": a.case, "preset": a.preset, "status": "skipped",
                          "reason": "needs a CUDA device"}))
        return
    if a.case == "cuda-graph" and a.warmup_measure < 2:
        sys.exit("--case cuda-graph needs --warmup-measure >= 2 (eager warm-up, then a replay)")
    if a.threads:
        torch.set_num_threads(a.threads)
    device = torch.device(a.device)
    cfg, A, B, T = a.model, a.accumulation, a.batch_size, a.model["block_size"]
    torch.manual_seed(a.seed)
    model = Gpt2(**cfg).to(device)
    total_steps = a.warmup_measure + a.max_steps
    # Synthetic: one more B*T than the run reads, so the offsets never wrap.
    tokens = (load_tokens(a.data) if a.data else
              synthetic_tokens((total_steps * A + 1) * B * T + 1, cfg["vocab_size"], a.seed))
    batches = Batches(tokens, B, T, device)

    graph = a.case == "cuda-graph"
    # On CUDA fused (capturable, lr a device tensor, in the graph); foreach on a CPU.
    opt = torch.optim.AdamW(model.parameters(), torch.tensor(a.lr, device=device) if graph
                            else a.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                            fused=True if device.type == "cuda" else None, capturable=graph)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda k: lr_ratio(k - 1, a.warmup_steps, total_steps))
    # The autocast cache must be off while a graph is captured.
    autocast = lambda: torch.autocast(device.type, dtype=torch.bfloat16,
                                      enabled=a.mixed_precision == "bf16",
                                      cache_enabled=not graph)
    losses = torch.zeros(total_steps, device=device)
    step = make_step(a.case, model, opt, sched, batches, losses, a, autocast)

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def run(steps):
        sync()
        clock = time.perf_counter()
        for s in steps:
            step(s)
        sync()
        return time.perf_counter() - clock
    warmup_s = run(range(a.warmup_measure))
    timed_s = run(range(a.warmup_measure, total_steps))

    params = sum(p.numel() for p in model.parameters())
    L, C = cfg["n_layer"], cfg["n_embd"]
    flops_per_token = 6 * (params - model.wpe.weight.numel()) + 12 * L * C * T
    tokens_per_s = a.max_steps * A * B * T / timed_s
    peak = peak_tflops(device, a.peak_tflops)
    step_s = timed_s / a.max_steps
    losses = losses.tolist()
    if a.profile:  # after the losses are read: the profiled steps add to theirs
        write_profile(a.profile, step, total_steps, device, sync)
    result = {
        "case": a.case, "preset": a.preset, "params": params,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "precision": a.mixed_precision, "steps": a.max_steps, "tokens_per_s": tokens_per_s,
        "step_ms": 1000 * step_s,
        "mfu": flops_per_token * tokens_per_s / (peak * 1e12) if peak else None,
        "flops_per_token": flops_per_token, "peak_tflops": peak,
        "peak_memory_mb": (torch.cuda.max_memory_allocated(device) / 2 ** 20
                           if device.type == "cuda" else None),
        "compile_s": (max(0.0, warmup_s - a.warmup_measure * step_s)
                      if a.case != "eager" else None),
        "final_loss": losses[-1], "batch_size": B, "accumulation": A, "model": cfg,
        "warmup_measure": a.warmup_measure, "threads": torch.get_num_threads(),
    }
    if a.losses:
        result["losses"] = losses
    print(json.dumps(result))


if __name__ == "__main__":
    main()
