#!/usr/bin/python3
"""Training throughput: clgrad vs PyTorch CPU on the same architectures.

Both sides: batch 128, SGD with momentum 0.9, synthetic 1x28x28 inputs,
images/s over the timed steps after warm-up steps. PyTorch uses 2 threads.
The clgrad numbers come from `clgrad bench train --json`, run in the same
invocation so both are measured under the same machine load.

usage: /usr/bin/python3 bench/train_vs_torch.py [--clgrad build/tools/clgrad]
           [--models lenet5,vgg-s] [--batch 128] [--steps 20] [--warmup 3] [--repeat 3]
"""
import argparse
import json
import statistics
import subprocess
import sys
import time

import torch
import torch.nn as nn


def lenet5():
    return nn.Sequential(
        nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, 10))


def vgg_s():
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 7 * 7, 256), nn.ReLU(), nn.Dropout(0.5), nn.Linear(256, 10))


MODELS = {"lenet5": (lenet5, "models/lenet5.cfg"), "vgg-s": (vgg_s, "models/vgg-s.cfg")}


def torch_images_per_s(build, batch, steps, warmup):
    torch.manual_seed(0)
    model = build()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    x = torch.randn(batch, 1, 28, 28)
    y = torch.randint(0, 10, (batch,))
    for i in range(warmup + steps):
        if i == warmup:
            t0 = time.perf_counter()
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
    return batch * steps / (time.perf_counter() - t0)


def clgrad_images_per_s(exe, cfg, batch, steps, warmup):
    out = subprocess.run([exe, "bench", "train", "--model", cfg, "--batch", str(batch), "--steps", str(steps),
                          "--warmup", str(warmup), "--json"], check=True, capture_output=True, text=True).stdout
    return json.loads(out)["images_per_s"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--clgrad", default="build/tools/clgrad")
    ap.add_argument("--models", default="lenet5,vgg-s")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; batch {a.batch}, "
          f"{a.steps} timed steps after {a.warmup} warm-up, median of {a.repeat} runs (alternating)")
    print(f"| model | PyTorch CPU images/s | clgrad images/s | clgrad / PyTorch |")
    print(f"|---|---:|---:|---:|")
    for name in a.models.split(","):
        build, cfg = MODELS[name]
        tt, cc = [], []
        for _ in range(a.repeat):
            tt.append(torch_images_per_s(build, a.batch, a.steps, a.warmup))
            cc.append(clgrad_images_per_s(a.clgrad, cfg, a.batch, a.steps, a.warmup))
        t, c = statistics.median(tt), statistics.median(cc)
        print(f"| {name} | {t:.0f} | {c:.0f} | {c / t:.2f}x |", flush=True)


if __name__ == "__main__":
    sys.exit(main())
