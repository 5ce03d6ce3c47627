#!/usr/bin/python3
"""gpt-mini (models/gpt-mini.cfg) against the same model and recipe in PyTorch.

The PyTorch side builds exactly the architecture of models/gpt-mini.cfg:
byte-level (vocabulary 256), context 128, 4 pre-layer-norm blocks
(x + attn(ln1(x)), x + mlp(ln2(x))) of 4 heads, width 128, MLP 512 with GELU
(erf), learned positions, final layer norm, LM head tied to the token
embedding without bias, biases elsewhere, dropout 0; initialised as GPT-2
(normal 0.02, zero biases, layer norms 1/0). Recipe: AdamW lr 1e-3, betas
0.9/0.95, eps 1e-8, weight decay 0.1 on matrices only (param groups: not on
biases, norms or the embedding tables), clgrad's cosine schedule with 100
steps of linear warm-up (clg_sched_lr, reproduced below), batch 32, gradient
clipping at global norm 1.0.

Two measurements:

  speed    training tokens/s (batch 32 x 128), each measurement in its own
           process, sides alternating from round to round, medians:
             clgrad          `clgrad bench train --model models/gpt-mini.cfg --json`
             torch1.13       /usr/bin/python3 (Debian's python3-torch), eager
             torch2          PyTorch 2.x eager       } from the peers venv
             torch2-compile  PyTorch 2.x torch.compile } (bench/setup_peers.sh)
  quality  STEPS steps of training on a text file (default 3000; the demo
           corpus: tools/text-demo.sh) on both sides with the same training
           windows: clgrad's (io/text.c: offset = fmix64(FNV-1a-64 of the
           little-endian {seed, epoch, position}, basis 0x74657874)) mod
           (head - 128)), reproduced here, so the data order does not depend
           on either side's random generator; the held-out loss (the file's
           last 10%, consecutive windows, mean over every position) at every
           epoch end and at the last step; both curves in one SVG.

usage:
  /usr/bin/python3 bench/gpt_vs_torch.py speed [--sides clgrad,torch1.13,torch2,torch2-compile]
        [--steps 10] [--warmup 2] [--repeat 3] [--threads 2] [--json FILE] [--baseline OTHER_CLGRAD]
  /usr/bin/python3 bench/gpt_vs_torch.py quality --data FILE [--steps 3000] [--sides clgrad,torch2]
        [--svg FILE] [--json FILE] [--eval-limit N]
Smoke check with Debian's torch 1.13 only (no torch.compile there):
  /usr/bin/python3 bench/gpt_vs_torch.py speed --sides torch1.13 --steps 2 --warmup 1 --repeat 1
  /usr/bin/python3 bench/gpt_vs_torch.py quality --data F --sides torch1.13 --steps 5 --eval-limit 8
On a GPU machine: --torch-device cuda runs the PyTorch sides there ($CLGRAD_PEERS_PYTHON
names the interpreter that has PyTorch) and --devices gpu puts clgrad on the GPU.
A side whose interpreter, package or model layers are missing is reported as n/a.
"""
import argparse
import csv
import json
import math
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
CFG = os.path.join(ROOT, "models", "gpt-mini.cfg")
SIDES = ["clgrad", "torch1.13", "torch2", "torch2-compile"]
# models/gpt-mini.cfg
VOCAB, CTX, LAYERS, HEADS, WIDTH, MLP = 256, 128, 4, 4, 128, 512
BATCH, LR, BETAS, EPS, WD, WARMUP, CLIP, EPOCHS = 32, 1e-3, (0.9, 0.95), 1e-8, 0.1, 100, 1.0, 6
HELDOUT_DIV = 10
M64 = (1 << 64) - 1


# ---------------------------------------------------------------- clgrad's text windows (io/text.c)
def window_offset(seed, epoch, pos, head):
    h = 0x74657874
    for b in struct.pack("<QQQ", seed & M64, epoch & M64, pos & M64):  # FNV-1a 64
        h = ((h ^ b) * 0x100000001B3) & M64
    h ^= h >> 33                                                       # murmur3 fmix64
    h = (h * 0xFF51AFD7ED558CCD) & M64
    h ^= h >> 33
    h = (h * 0xC4CEB9FE1A85EC53) & M64
    h ^= h >> 33
    return h % (head - CTX)


def split_text(data):
    tail = len(data) // HELDOUT_DIV
    return data[:len(data) - tail], data[len(data) - tail:]


def sched_lr(step, total):
    """clg_sched_lr for schedule = cosine, warmup = WARMUP."""
    lr = LR
    span = total - WARMUP
    if span > 0 and step >= WARMUP:
        p = min(1.0, (step - WARMUP) / span)
        lr *= 0.5 * (1.0 + math.cos(math.pi * p))
    if step < WARMUP:
        lr *= (step + 1) / WARMUP
    return lr


# ---------------------------------------------------------------- the PyTorch model
def build(torch, threads, device="cpu"):
    import torch.nn as nn
    import torch.nn.functional as F

    torch.set_num_threads(threads)
    sdpa = getattr(F, "scaled_dot_product_attention", None)  # torch >= 2.0

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1 = nn.LayerNorm(WIDTH, eps=1e-5)
            self.qkv = nn.Linear(WIDTH, 3 * WIDTH)  # qkv_weight (3C x C) + qkv_bias
            self.proj = nn.Linear(WIDTH, WIDTH)     # out_weight + out_bias
            self.ln2 = nn.LayerNorm(WIDTH, eps=1e-5)
            self.fc = nn.Linear(WIDTH, MLP)
            self.out = nn.Linear(MLP, WIDTH)
            self.register_buffer("mask", torch.tril(torch.ones(CTX, CTX, dtype=torch.bool)), persistent=False)

        def forward(self, x):
            B, T, C = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
            q, k, v = (t.view(B, T, HEADS, C // HEADS).transpose(1, 2) for t in (q, k, v))
            if sdpa is not None:
                y = sdpa(q, k, v, is_causal=True)
            else:
                att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // HEADS))
                att = att.masked_fill(~self.mask[:T, :T], float("-inf")).softmax(dim=-1)
                y = att @ v
            x = x + self.proj(y.transpose(1, 2).contiguous().view(B, T, C))
            return x + self.out(F.gelu(self.fc(self.ln2(x))))  # GELU, erf form

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(VOCAB, WIDTH)
            self.pos = nn.Parameter(torch.zeros(CTX, WIDTH))
            self.blocks = nn.ModuleList([Block() for _ in range(LAYERS)])
            self.ln_f = nn.LayerNorm(WIDTH, eps=1e-5)
            for m in self.modules():
                if isinstance(m, nn.Linear):
                    nn.init.normal_(m.weight, 0.0, 0.02)
                    nn.init.zeros_(m.bias)
                elif isinstance(m, nn.Embedding):
                    nn.init.normal_(m.weight, 0.0, 0.02)
            nn.init.normal_(self.pos, 0.0, 0.02)

        def forward(self, idx):
            x = self.tok(idx) + self.pos[: idx.shape[1]]
            for b in self.blocks:
                x = b(x)
            return self.ln_f(x) @ self.tok.weight.t()  # tied head, no bias

    model = GPT().to(device)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and n not in ("tok.weight", "pos")]
    rest = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and n not in ("tok.weight", "pos"))]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WD}, {"params": rest, "weight_decay": 0.0}],
                            lr=LR, betas=BETAS, eps=EPS)
    return model, opt


def train_step(torch, model, fwd, opt, x, y, lr):
    import torch.nn.functional as F

    for g in opt.param_groups:
        g["lr"] = lr
    opt.zero_grad(set_to_none=True)
    logits = fwd(x)
    loss = F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))  # mean over N T positions
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
    opt.step()
    return loss


def worker_speed(a):
    import torch

    torch.manual_seed(0)
    model, opt = build(torch, a.threads, a.torch_device)
    fwd = torch.compile(model) if a.mode == "compile" else model
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, VOCAB, (BATCH, CTX), generator=g).to(a.torch_device)
    y = torch.randint(0, VOCAB, (BATCH, CTX), generator=g).to(a.torch_device)
    t0 = time.perf_counter()
    for i in range(a.warmup + a.steps):
        if i == a.warmup:
            if a.torch_device != "cpu":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
        loss = train_step(torch, model, fwd, opt, x, y, LR * 0.1)
    loss.item()
    dt = time.perf_counter() - t0
    return {"tokens_per_s": BATCH * CTX * a.steps / dt, "version": torch.__version__}


def heldout_loss(torch, model, tail, limit, device="cpu"):
    import torch.nn.functional as F

    n = (len(tail) - 1) // CTX
    if limit:
        n = min(n, limit)
    tot, cnt = 0.0, 0
    model.eval()
    with torch.no_grad():
        for b0 in range(0, n, BATCH):
            idx = range(b0, min(n, b0 + BATCH))
            w = torch.tensor([list(tail[i * CTX:i * CTX + CTX + 1]) for i in idx], dtype=torch.long).to(device)
            logits = model(w[:, :-1])
            tot += F.cross_entropy(logits.reshape(-1, VOCAB), w[:, 1:].reshape(-1), reduction="sum").item()
            cnt += w.shape[0] * CTX
    model.train()
    return tot / cnt


def worker_quality(a):
    import torch

    torch.manual_seed(a.seed)
    model, opt = build(torch, a.threads, a.torch_device)
    with open(a.data, "rb") as f:
        head, tail = split_text(f.read())
    n = len(head) // CTX                      # windows per epoch (clgrad's text dataset n)
    spe = -(-n // BATCH)                      # steps per epoch
    total = spe * EPOCHS                      # the schedule's length, as clgrad's trainer
    curve, step, t0 = [], 0, time.perf_counter()
    for e in range(EPOCHS):
        for b in range(spe):
            if step >= a.steps:
                break
            pos = range(b * BATCH, min(n, (b + 1) * BATCH))
            w = [window_offset(a.seed, e, p, len(head)) for p in pos]
            win = torch.tensor([list(head[o:o + CTX + 1]) for o in w], dtype=torch.long).to(a.torch_device)
            loss = train_step(torch, model, model, opt, win[:, :-1], win[:, 1:], sched_lr(step, total))
            step += 1
            if step % 100 == 0:
                print("  torch step %d loss %.4f (%.0f s)" % (step, loss.item(), time.perf_counter() - t0),
                      file=sys.stderr, flush=True)
        if step >= a.steps and (step % spe) != 0:
            break
        curve.append((step, heldout_loss(torch, model, tail, a.eval_limit, a.torch_device)))  # epoch end, as clgrad
        if step >= a.steps:
            break
    if not curve or curve[-1][0] != step:
        curve.append((step, heldout_loss(torch, model, tail, a.eval_limit, a.torch_device)))
    return {"curve": curve, "seconds": time.perf_counter() - t0, "version": torch.__version__}


# ---------------------------------------------------------------- driver
def peers_python():
    if os.environ.get("CLGRAD_PEERS_PYTHON"):
        return os.environ["CLGRAD_PEERS_PYTHON"]
    return os.path.join(os.environ.get("CLGRAD_PEERS_VENV", "/work/venv-peers"), "bin", "python")


def run(cmd, timeout, env=None):
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return None, "timed out after %d s" % timeout
    if res.returncode != 0:
        tail = (res.stderr.strip().splitlines() or ["?"])[-1]
        return None, "failed: %s" % tail[:240]
    return res, ""


def torch_cmd(side, a, worker, extra):
    py = "/usr/bin/python3" if side == "torch1.13" else peers_python()
    if not os.access(py, os.X_OK):
        return None, "no interpreter %s" % py
    mode = "compile" if side == "torch2-compile" else "eager"
    cmd = [py, os.path.abspath(__file__), "--worker", worker, "--mode", mode, "--threads", str(a.threads),
           "--torch-device", a.torch_device] + extra
    env = dict(os.environ) if a.torch_device != "cpu" else dict(os.environ, CUDA_VISIBLE_DEVICES="")
    env.pop("PYTHONPATH", None)
    return (cmd, env), ""


def speed_side(side, a):
    """tokens/s (None when unavailable) and a note."""
    if side in ("clgrad", "clgrad-base"):
        cmd = [a.clgrad if side == "clgrad" else a.baseline, "bench", "train", "--model", CFG, "--batch", str(BATCH), "--steps", str(a.steps),
               "--warmup", str(a.warmup), "--json"] + (["--devices", a.devices] if a.devices else [])
        res, note = run(cmd, a.timeout)
        if res is None:
            return None, note
        r = json.loads([l for l in res.stdout.splitlines() if l.startswith("{")][-1])
        return r["images_per_s"] * CTX, side
    c, note = torch_cmd(side, a, "speed", ["--steps", str(a.steps), "--warmup", str(a.warmup)])
    if c is None:
        return None, note
    res, note = run(c[0], a.timeout, c[1])
    if res is None:
        return None, note
    r = json.loads([l for l in res.stdout.splitlines() if l.startswith("{")][-1])
    return r["tokens_per_s"], r["version"]


def speed(a, sides):
    print("gpt-mini, batch %d x %d tokens, %d timed steps after %d warm-up, %d threads for PyTorch, median of %d "
          "alternating rounds; load average at start %.2f" %
          (BATCH, CTX, a.steps, a.warmup, a.threads, a.repeat, os.getloadavg()[0]), flush=True)
    vals, notes, loads = {s: [] for s in sides}, {}, [os.getloadavg()[0]]
    for rnd in range(a.repeat):
        for s in (sides if rnd % 2 == 0 else list(reversed(sides))):
            v, notes[s] = speed_side(s, a)
            if v is not None:
                vals[s].append(v)
            print("  round %d %-15s %s" % (rnd + 1, s, "%.0f tokens/s" % v if v is not None else notes[s]),
                  file=sys.stderr, flush=True)
        loads.append(os.getloadavg()[0])
    med = {s: statistics.median(v) if v else None for s, v in vals.items()}
    t2 = [med[s] for s in ("torch2", "torch2-compile") if med.get(s)]
    ratio = "%.2fx" % (med["clgrad"] / max(t2)) if t2 and med.get("clgrad") else "n/a"
    if med.get("clgrad") and med.get("clgrad-base"):
        ratio += " (clgrad / clgrad-base %.2fx)" % (med["clgrad"] / med["clgrad-base"])
    print("\n| model | " + " | ".join(sides) + " | clgrad / best PyTorch 2.x | load (1-min) |")
    print("|---|" + "---:|" * (len(sides) + 1) + "---|")
    print("| gpt-mini (tokens/s) | %s | %s | %.1f-%.1f |" % (
        " | ".join("{:,.0f}".format(med[s]) if med[s] else "n/a" for s in sides), ratio, min(loads), max(loads)))
    print("\nversions / notes: " + "; ".join("%s %s" % kv for kv in sorted(notes.items())
                                            if kv[0] not in ("clgrad", "clgrad-base")))
    return {"runs": vals, "median": med, "notes": notes, "load": loads}


def clgrad_quality(a, tmp):
    """clgrad's held-out curve: the log's epoch rows, then `clgrad eval` of the final weights."""
    log, w = os.path.join(tmp, "run.csv"), os.path.join(tmp, "w.safetensors")
    cmd = [a.clgrad, "train", CFG, "--data", "text:" + a.data, "--steps", str(a.steps), "--seed", str(a.seed),
           "--log", log, "--save", w] + (["--devices", a.devices] if a.devices else [])
    t0 = time.perf_counter()
    res, note = run(cmd, a.timeout)
    if res is None:
        return None, note
    secs = time.perf_counter() - t0
    curve = []
    with open(log) as f:
        for row in csv.DictReader(f):
            if row.get("test_loss") not in (None, "", "-1"):
                curve.append((int(row["step"]), float(row["test_loss"])))
    res, note = run([a.clgrad, "eval", CFG, "--weights", w, "--data", "text:" + a.data] +
                    (["--limit", str(a.eval_limit)] if a.eval_limit else []), a.timeout)
    if res is None:
        return None, note
    loss = [float(l.split()[1]) for l in res.stdout.splitlines() if l.startswith("loss ")]
    if loss and (not curve or curve[-1][0] != a.steps):
        curve.append((a.steps, loss[0]))
    return {"curve": curve, "seconds": secs, "version": "clgrad"}, ""


def svg(path, curves, title):
    W, H, L, B = 640, 400, 60, 40
    pts = [p for c in curves.values() for p in c]
    if not pts:
        return
    x1 = max(p[0] for p in pts) or 1
    y0, y1 = min(p[1] for p in pts), max(p[1] for p in pts)
    y0, y1 = (y0 - 0.05, y1 + 0.05) if y1 - y0 < 1e-9 else (y0 - 0.05 * (y1 - y0), y1 + 0.05 * (y1 - y0))
    sx = lambda x: L + (W - L - 20) * x / x1
    sy = lambda y: 20 + (H - 20 - B) * (y1 - y) / (y1 - y0)
    colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]
    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">'
           % (W, H), '<rect width="100%" height="100%" fill="white"/>',
           '<text x="%d" y="14">%s</text>' % (L, title),
           '<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>' % (L, H - B, W - 20, H - B),
           '<line x1="%d" y1="20" x2="%d" y2="%d" stroke="black"/>' % (L, L, H - B),
           '<text x="%d" y="%d">step</text>' % (W // 2, H - 8)]
    for k in range(5):
        y = y0 + (y1 - y0) * k / 4
        out.append('<text x="4" y="%.0f">%.3f</text>' % (sy(y) + 4, y))
        x = x1 * k / 4
        out.append('<text x="%.0f" y="%d">%d</text>' % (sx(x) - 10, H - B + 16, x))
    for i, (name, c) in enumerate(sorted(curves.items())):
        col = colors[i % len(colors)]
        out.append('<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>' % (
            col, " ".join("%.1f,%.1f" % (sx(x), sy(y)) for x, y in c)))
        out += ['<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>' % (sx(x), sy(y), col) for x, y in c]
        out.append('<text x="%d" y="%d" fill="%s">%s (final %.4f)</text>' % (W - 220, 40 + 16 * i, col, name,
                                                                           c[-1][1]))
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def quality(a, sides):
    if not a.data:
        sys.exit("quality needs --data FILE (e.g. the corpus of tools/text-demo.sh)")
    print("gpt-mini quality: %d steps on %s, seed %d, held-out loss at every epoch end and at the end" %
          (a.steps, a.data, a.seed), flush=True)
    out, curves = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for s in sides:
            if s == "clgrad":
                r, note = clgrad_quality(a, tmp)
            else:
                c, note = torch_cmd(s, a, "quality", ["--data", a.data, "--steps", str(a.steps), "--seed",
                                                     str(a.seed), "--eval-limit", str(a.eval_limit)])
                r = None
                if c is not None:
                    res, note = run(c[0], a.timeout, c[1])
                    if res is not None:
                        r = json.loads([l for l in res.stdout.splitlines() if l.startswith("{")][-1])
            out[s] = r if r is not None else {"note": note}
            if r is not None:
                curves[s] = [tuple(p) for p in r["curve"]]
            print("  %-15s %s" % (s, "held-out loss %s (%.0f s)" % (
                ", ".join("%d: %.4f" % tuple(p) for p in r["curve"]), r["seconds"]) if r else note), flush=True)
    fin = {s: c[-1][1] for s, c in curves.items() if c}
    if "clgrad" in fin and len(fin) > 1:
        best = min(v for s, v in fin.items() if s != "clgrad")
        print("final held-out loss: clgrad %.4f vs PyTorch %.4f: %+.2f%% (target within 2%%)" %
              (fin["clgrad"], best, 100 * (fin["clgrad"] - best) / best))
    if a.svg and curves:
        svg(a.svg, curves, "gpt-mini held-out loss (nats per byte), %d steps" % a.steps)
        print("curves: %s" % a.svg)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", nargs="?", choices=["speed", "quality"], default="speed")
    ap.add_argument("--clgrad", default=os.path.join(ROOT, "build", "tools", "clgrad"))
    ap.add_argument("--sides", default=None)
    ap.add_argument("--baseline", default=None,
                    help="speed: a second clgrad binary (e.g. main's build), side clgrad-base, in the same rounds")
    ap.add_argument("--steps", type=int, default=None, help="speed: timed steps (10); quality: steps (3000)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--devices", default=None, help="clgrad --devices")
    ap.add_argument("--data", default=None)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--eval-limit", type=int, default=0, help="held-out windows evaluated (0: all)")
    ap.add_argument("--svg", default="gpt_vs_torch.svg")
    ap.add_argument("--timeout", type=int, default=7200, help="seconds per measurement")
    ap.add_argument("--json", default=None)
    ap.add_argument("--torch-device", default="cpu", help="PyTorch's device (cpu; cuda on a GPU machine)")
    ap.add_argument("--worker", choices=["speed", "quality"])  # internal
    ap.add_argument("--mode", default="eager", choices=["eager", "compile"])
    a = ap.parse_args()
    if a.steps is None:
        a.steps = 10 if (a.worker or a.what) == "speed" else 3000
    if a.worker:
        print(json.dumps(worker_speed(a) if a.worker == "speed" else worker_quality(a)))
        return 0
    sides = [s for s in (a.sides or (",".join(SIDES) if a.what == "speed" else "clgrad,torch2")).split(",") if s]
    if a.baseline and "clgrad-base" not in sides:
        sides.insert(1, "clgrad-base")
    for s in sides:
        if s not in SIDES + ["clgrad-base"]:
            sys.exit("unknown side %s (known: %s)" % (s, ", ".join(SIDES)))
    r = speed(a, sides) if a.what == "speed" else quality(a, sides)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(r, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
