#!/usr/bin/python3
"""Training throughput: clgrad against PyTorch (Debian's 1.13 and 2.x from
PyPI in three CPU modes) and tinygrad (OpenCL backend, same PoCL device).

Every side trains the same architectures: batch 128, SGD with momentum 0.9,
synthetic inputs of each model's shape (1x28x28; ResNet-20 3x32x32), images/s over the timed steps after warm-up steps
(torch.compile and tinygrad's JIT compile during the warm-up). PyTorch uses
--threads threads. Each measurement runs in its own process, sides in
alternating order from round to round; the table shows medians.

Sides (--sides, comma list):
  clgrad          `clgrad bench train --json`
  torch1.13       /usr/bin/python3 (Debian python3-torch), eager NCHW
  torch2          PyTorch 2.x eager NCHW            } from the peers venv
  torch2-cl       PyTorch 2.x eager channels-last   } (bench/setup_peers.sh;
  torch2-compile  PyTorch 2.x torch.compile, NCHW   }  $CLGRAD_PEERS_VENV or
  tinygrad        tinygrad, DEV=CL (OpenCL on PoCL) }  /work/venv-peers)
  clgrad-ref      a second clgrad binary (--clgrad-ref PATH, e.g. another branch's build) for an A/B
                  in the same alternating rounds; only when named in --sides
A side whose interpreter or package is missing is reported as n/a.
On a GPU machine: --torch-device cuda runs the PyTorch sides there ($CLGRAD_PEERS_PYTHON names
the interpreter that has PyTorch) and --devices gpu puts clgrad on the GPU.

usage: /usr/bin/python3 bench/train_vs_torch.py [--clgrad build/tools/clgrad]
           [--models lenet5,vgg-s,resnet-mini,resnet20] [--sides ...] [--clgrad-ref PATH] [--batch 128] [--steps 20] [--warmup 3]
           [--repeat 3] [--tinygrad-steps 5] [--tinygrad-rounds 1] [--json FILE]
Per-op profile of the PyTorch twin (one worker, channels-last, self CPU time per op and input shape):
  /work/venv-peers/bin/python bench/train_vs_torch.py --worker torch --mode channels-last --model resnet20 \
      --steps 5 --torch-profile 30
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ALL_SIDES = ["clgrad", "torch1.13", "torch2", "torch2-cl", "torch2-compile", "tinygrad"]
EXTRA_SIDES = ["clgrad-ref"]  # only when named in --sides: a second clgrad binary (--clgrad-ref) for A/B
CFG = {"lenet5": "models/lenet5.cfg", "vgg-s": "models/vgg-s.cfg", "resnet-mini": "models/resnet-mini.cfg",
       "resnet20": "models/resnet20.cfg"}
# input shape (channels, height, width) per model, as in its .cfg [net] section
SHAPE = {"lenet5": (1, 28, 28), "vgg-s": (1, 28, 28), "resnet-mini": (1, 28, 28), "resnet20": (3, 32, 32)}


# ---------------------------------------------------------------- PyTorch worker
def torch_models(nn):
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

    class Block(nn.Module):  # models/resnet-mini.cfg: conv-bn-relu-conv-bn (+ projection) + add, relu
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.b1 = nn.BatchNorm2d(cout)
            self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.b2 = nn.BatchNorm2d(cout)
            self.proj = None
            if stride != 1 or cin != cout:
                self.proj = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            y = self.b2(self.c2(self.b1(self.c1(x)).relu()))
            return (y + (self.proj(x) if self.proj is not None else x)).relu()

    def resnet_mini():
        return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
                             Block(16, 16, 1), Block(16, 32, 2), Block(32, 32, 1),
                             nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))

    def resnet20():  # models/resnet20.cfg: 3 stages x 3 blocks at 16/32/64, 1x1 projection + BN at the transitions
        blocks = []
        for cin, cout, stride in ((16, 16, 1), (16, 32, 2), (32, 64, 2)):
            blocks += [Block(cin, cout, stride), Block(cout, cout, 1), Block(cout, cout, 1)]
        return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(), *blocks,
                             nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))

    return {"lenet5": lenet5, "vgg-s": vgg_s, "resnet-mini": resnet_mini, "resnet20": resnet20}


def worker_torch(a):
    import torch
    import torch.nn as nn

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = torch_models(nn)[a.model]().to(a.torch_device)
    x = torch.randn(a.batch, *SHAPE[a.model]).to(a.torch_device)
    y = torch.randint(0, 10, (a.batch,)).to(a.torch_device)
    if a.mode == "channels-last":
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    fwd = torch.compile(model) if a.mode == "compile" else model
    loss_fn = nn.CrossEntropyLoss()
    model.train()
    if a.torch_profile:  # per-op profile of the timed steps (grouped by input shape: one row per layer shape)
        return torch_profile(a, torch, model, fwd, opt, loss_fn, x, y)
    t0 = time.perf_counter()
    for i in range(a.warmup + a.steps):
        if i == a.warmup:
            if a.torch_device != "cpu":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(fwd(x), y)
        loss.backward()
        opt.step()
    loss.item()
    dt = time.perf_counter() - t0
    return {"images_per_s": a.batch * a.steps / dt, "version": torch.__version__}


def torch_profile(a, torch, model, fwd, opt, loss_fn, x, y):
    """--torch-profile: torch.profiler over the timed steps; prints self CPU time per op and input shape,
    ms per step (the PyTorch half of the per-layer table in docs/benchmarks.md)."""
    def step():
        opt.zero_grad(set_to_none=True)
        loss_fn(fwd(x), y).backward()
        opt.step()
    for _ in range(a.warmup):
        step()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        t0 = time.perf_counter()
        for _ in range(a.steps):
            step()
        dt = time.perf_counter() - t0
    rows = [(e.self_cpu_time_total / 1e3 / a.steps, e.key, str(e.input_shapes)[:70], e.count // a.steps)
            for e in prof.key_averages(group_by_input_shape=True)]
    rows.sort(reverse=True)
    print("%-9s %-34s %-6s %s" % ("ms/step", "op (self CPU)", "calls", "input shapes"), file=sys.stderr)
    for ms, key, shapes, calls in rows[:a.torch_profile]:
        print("%9.3f %-34s %-6d %s" % (ms, key[:34], calls, shapes), file=sys.stderr)
    print("%9.3f total ms/step (profiled)" % (dt / a.steps * 1e3), file=sys.stderr)
    return {"images_per_s": a.batch * a.steps / dt, "version": torch.__version__}


# ---------------------------------------------------------------- tinygrad worker
def worker_tinygrad(a):
    from importlib.metadata import version

    import numpy as np
    os.environ["TRAINING"] = "1"  # tinygrad's training flag (dropout, batch statistics), read at import
    from tinygrad import Device, Tensor, TinyJit, nn
    from tinygrad.nn.state import get_parameters

    class LeNet5:
        def __init__(self):
            self.c1, self.c2 = nn.Conv2d(1, 6, 5, padding=2), nn.Conv2d(6, 16, 5)
            self.l1, self.l2, self.l3 = nn.Linear(400, 120), nn.Linear(120, 84), nn.Linear(84, 10)

        def __call__(self, x):
            x = self.c1(x).relu().max_pool2d(2)
            x = self.c2(x).relu().max_pool2d(2).flatten(1)
            return self.l3(self.l2(self.l1(x).relu()).relu())

    class VggS:
        def __init__(self):
            self.c = [nn.Conv2d(1, 32, 3, padding=1), nn.Conv2d(32, 32, 3, padding=1),
                      nn.Conv2d(32, 64, 3, padding=1), nn.Conv2d(64, 64, 3, padding=1)]
            self.l1, self.l2 = nn.Linear(64 * 7 * 7, 256), nn.Linear(256, 10)

        def __call__(self, x):
            x = self.c[1](self.c[0](x).relu()).relu().max_pool2d(2)
            x = self.c[3](self.c[2](x).relu()).relu().max_pool2d(2).flatten(1)
            return self.l2(self.l1(x).relu().dropout(0.5))

    class Block:
        def __init__(self, cin, cout, stride):
            self.c1, self.b1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm(cout)
            self.c2, self.b2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm(cout)
            self.proj = None
            if stride != 1 or cin != cout:
                self.proj = (nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm(cout))

        def __call__(self, x):
            y = self.b2(self.c2(self.b1(self.c1(x)).relu()))
            return (y + (self.proj[1](self.proj[0](x)) if self.proj else x)).relu()

    class ResnetMini:
        def __init__(self, cin=1, spec=((16, 16, 1), (16, 32, 2), (32, 32, 1))):
            self.stem, self.bn = nn.Conv2d(cin, 16, 3, padding=1, bias=False), nn.BatchNorm(16)
            self.blocks = [Block(*b) for b in spec]
            self.fc = nn.Linear(spec[-1][1], 10)

        def __call__(self, x):
            x = self.bn(self.stem(x)).relu()
            for b in self.blocks:
                x = b(x)
            return self.fc(x.mean(axis=(2, 3)))

    Tensor.manual_seed(0)
    r20 = [b for cin, cout, st in ((16, 16, 1), (16, 32, 2), (32, 64, 2)) for b in ((cin, cout, st), (cout, cout, 1),
                                                                                 (cout, cout, 1))]
    model = {"lenet5": LeNet5, "vgg-s": VggS, "resnet-mini": ResnetMini,
             "resnet20": lambda: ResnetMini(3, tuple(r20))}[a.model]()
    opt = nn.optim.SGD(get_parameters(model), lr=0.01, momentum=0.9)
    x = Tensor.randn(a.batch, *SHAPE[a.model]).realize()
    y = Tensor(np.random.default_rng(0).integers(0, 10, a.batch).astype(np.int32)).realize()

    @TinyJit
    def step():
        opt.zero_grad()
        loss = model(x).sparse_categorical_crossentropy(y).backward()
        opt.step()
        return loss.realize()

    t0 = time.perf_counter()
    for i in range(a.warmup + a.steps):
        if i == a.warmup:
            Device[Device.DEFAULT].synchronize()
            t0 = time.perf_counter()
        loss = step()
    loss.item()
    dt = time.perf_counter() - t0
    return {"images_per_s": a.batch * a.steps / dt, "version": version("tinygrad"), "device": Device.DEFAULT}


# ---------------------------------------------------------------- driver
def peers_python():
    if os.environ.get("CLGRAD_PEERS_PYTHON"):
        return os.environ["CLGRAD_PEERS_PYTHON"]
    venv = os.environ.get("CLGRAD_PEERS_VENV", "/work/venv-peers")
    return os.path.join(venv, "bin", "python")


def run_side(side, a, model):
    """images/s (None when the side is unavailable or failed) and a note."""
    if side in ("clgrad", "clgrad-ref"):
        exe = a.clgrad if side == "clgrad" else a.clgrad_ref
        if not exe or not os.access(exe, os.X_OK):
            return None, "no clgrad binary %s (--clgrad-ref)" % exe
        cmd = [exe, "bench", "train", "--model", os.path.join(HERE, "..", CFG[model]), "--batch", str(a.batch),
               "--steps", str(a.steps), "--warmup", str(a.warmup), "--json"]
        if a.devices:
            cmd += ["--devices", a.devices]
        env = None
    else:
        py = "/usr/bin/python3" if side == "torch1.13" else peers_python()
        if not os.access(py, os.X_OK):
            return None, "no interpreter %s" % py
        worker = "tinygrad" if side == "tinygrad" else "torch"
        mode = {"torch2-cl": "channels-last", "torch2-compile": "compile"}.get(side, "eager")
        steps, warmup = (a.tinygrad_steps, max(a.warmup, 2)) if side == "tinygrad" else (a.steps, a.warmup)
        cmd = [py, os.path.abspath(__file__), "--worker", worker, "--mode", mode, "--model", model,
               "--batch", str(a.batch), "--steps", str(steps), "--warmup", str(warmup), "--threads", str(a.threads),
               "--torch-device", a.torch_device]
        env = dict(os.environ, DEV="CL") if a.torch_device != "cpu" else dict(os.environ, CUDA_VISIBLE_DEVICES="", DEV="CL")
        env.pop("PYTHONPATH", None)
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout, env=env)
    except subprocess.TimeoutExpired:
        return None, "timed out after %d s" % a.timeout
    if res.returncode != 0:
        tail = (res.stderr.strip().splitlines() or ["?"])[-1]
        return None, "failed: %s" % tail[:200]
    lines = [l for l in res.stdout.splitlines() if l.startswith("{")]
    if not lines:
        return None, "no result"
    r = json.loads(lines[-1])
    return r["images_per_s"], r.get("version", "")


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            names = [l.split(":", 1)[1].strip() for l in f if l.startswith("model name")]
        return "%s (%d logical CPUs)" % (names[0], len(names)) if names else "unknown"
    except OSError:
        return "unknown"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clgrad", default=os.path.join(HERE, "..", "build", "tools", "clgrad"))
    ap.add_argument("--clgrad-ref", default=None, help="second clgrad binary for the clgrad-ref side (A/B)")
    ap.add_argument("--models", default="lenet5,vgg-s,resnet-mini,resnet20")
    ap.add_argument("--sides", default=",".join(ALL_SIDES))
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--devices", default=None, help="clgrad --devices (default: its own default)")
    ap.add_argument("--tinygrad-steps", type=int, default=5)
    ap.add_argument("--tinygrad-rounds", type=int, default=1, help="rounds that include tinygrad (slow)")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per measurement")
    ap.add_argument("--json", default=None, help="write every measurement to this file")
    ap.add_argument("--torch-device", default="cpu", help="PyTorch's device (cpu; cuda on a GPU machine)")
    # worker mode (internal)
    ap.add_argument("--worker", choices=["torch", "tinygrad"])
    ap.add_argument("--mode", default="eager", choices=["eager", "channels-last", "compile"])
    ap.add_argument("--model", default="lenet5")
    ap.add_argument("--torch-profile", type=int, default=0, metavar="ROWS",
                    help="worker: profile the timed steps with torch.profiler, print the ROWS costliest ops")
    a = ap.parse_args()
    if a.worker:
        r = worker_torch(a) if a.worker == "torch" else worker_tinygrad(a)
        print(json.dumps(r))
        return 0

    sides = [s for s in a.sides.split(",") if s]
    for s in sides:
        if s not in ALL_SIDES + EXTRA_SIDES:
            sys.exit("unknown side %s (known: %s)" % (s, ", ".join(ALL_SIDES + EXTRA_SIDES)))
    models = [m for m in a.models.split(",") if m]
    print("batch %d, %d timed steps after %d warm-up (tinygrad %d after %d), %d threads for PyTorch, "
          "median of %d alternating rounds; load average at start %.2f" %
          (a.batch, a.steps, a.warmup, a.tinygrad_steps, max(a.warmup, 2), a.threads, a.repeat, os.getloadavg()[0]),
          flush=True)
    print("CPU: %s" % cpu_model(), flush=True)
    raw = {}
    for m in models:
        vals = {s: [] for s in sides}
        notes = {}
        loads = [os.getloadavg()[0]]
        for rnd in range(a.repeat):
            order = sides if rnd % 2 == 0 else list(reversed(sides))
            for s in order:
                if s == "tinygrad" and rnd >= a.tinygrad_rounds:
                    continue
                v, note = run_side(s, a, m)
                if v is not None:
                    vals[s].append(v)
                notes[s] = note
                print("  %s round %d %-15s %s" % (m, rnd + 1, s, "%.1f img/s" % v if v is not None else note),
                      file=sys.stderr, flush=True)
            loads.append(os.getloadavg()[0])
        med = {s: statistics.median(v) if v else None for s, v in vals.items()}
        raw[m] = {"runs": vals, "median": med, "notes": notes, "load": loads}
    # table
    print()
    ab = "clgrad" in sides and "clgrad-ref" in sides
    print("| model | " + " | ".join(sides) + " | clgrad / best PyTorch 2.x |" +
          (" clgrad-ref / best PyTorch 2.x | clgrad / clgrad-ref |" if ab else "") + " load (1-min) |")
    print("|---|" + "---:|" * (len(sides) + 1 + (2 if ab else 0)) + "---|")
    for m in models:
        med = raw[m]["median"]
        t2 = [med[s] for s in ("torch2", "torch2-cl", "torch2-compile") if s in med and med[s]]
        best = max(t2) if t2 else None

        def ratio(num, den):
            return "%.2fx" % (num / den) if num and den else "n/a"
        ratios = [ratio(med.get("clgrad"), best)]
        if ab:
            ratios += [ratio(med["clgrad-ref"], best), ratio(med["clgrad"], med["clgrad-ref"])]
        cells = ["{:,.0f}".format(med[s]) if med[s] else "n/a" for s in sides]
        ld = raw[m]["load"]
        print("| %s | %s | %s | %.1f-%.1f |" % (m, " | ".join(cells), " | ".join(ratios), min(ld), max(ld)))
    vers = {s: n for m in models for s, n in raw[m]["notes"].items() if not s.startswith("clgrad")}
    print("\nversions / notes: " + "; ".join("%s %s" % kv for kv in sorted(vers.items())))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(raw, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
