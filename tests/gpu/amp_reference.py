"""PyTorch's side of tests/gpu/test_gpu_amp_vs_python.cpp: the same model,
weights and batches (read from the safetensors file the test wrote), trained
for --steps steps on the GPU under torch.autocast, with torch.amp.GradScaler
for fp16, and SGD with momentum (the single-tensor loop, whose arithmetic is
LibTorch's C++ SGD's). Prints one JSON line: per-step loss, the loss scale
the step's backward used, and whether the step was skipped for an overflow.

    python3 amp_reference.py FILE --precision fp16 --steps 200 \
        --init-scale-power 24 --growth-interval 25 --lr 0.05
"""
import argparse
import json

import torch
import torch.nn.functional as F
from safetensors.torch import load_file


def main():
    p = argparse.ArgumentParser()
    p.add_argument("file")
    p.add_argument("--precision", choices=["bf16", "fp16"], required=True)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--init-scale-power", type=int, default=16)
    p.add_argument("--growth-interval", type=int, default=2000)
    p.add_argument("--lr", type=float, default=0.05)
    a = p.parse_args()

    t = {k: v.cuda() for k, v in load_file(a.file).items()}
    layers = sorted({k.split(".")[0] for k in t if k.startswith("fc")})
    weights = [(t[f"{n}.weight"].requires_grad_(), t[f"{n}.bias"].requires_grad_()) for n in layers]
    params = [p for pair in weights for p in pair]
    opt = torch.optim.SGD(params, lr=a.lr, momentum=0.9, foreach=False)
    fp16 = a.precision == "fp16"
    dtype = torch.float16 if fp16 else torch.bfloat16
    scaler = torch.amp.GradScaler("cuda", init_scale=2.0 ** a.init_scale_power,
                                  growth_interval=a.growth_interval, enabled=fp16)
    x, y = t["x"], t["y"]
    losses, scales, skipped = [], [], []
    for step in range(a.steps):
        xb, yb = x[step % x.shape[0]], y[step % y.shape[0]]
        opt.zero_grad()
        with torch.autocast("cuda", dtype=dtype):
            h = xb
            for i, (w, b) in enumerate(weights):
                h = F.linear(h, w, b)
                if i + 1 < len(weights):
                    h = F.relu(h)
            loss = F.mse_loss(h, yb)
        scale = scaler.get_scale() if fp16 else 1.0
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        losses.append(loss.item())
        scales.append(scale)
        skipped.append(fp16 and scaler.get_scale() < scale)
    print(json.dumps({"loss": losses, "scale": scales, "skipped": skipped,
                      "torch": torch.__version__, "device": torch.cuda.get_device_name()}))


if __name__ == "__main__":
    main()
