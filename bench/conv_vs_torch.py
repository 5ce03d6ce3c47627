#!/usr/bin/python3
"""Convolution forward+backward: clgrad (OpenCL) against PyTorch CPU on the
3x3 conv layers of models/vgg-s (Fashion-MNIST 28x28x1, batch 128, pad 1).

Both are measured in the same run on the same machine:
  * clgrad: `clgrad bench conv --shapes vgg-s --pass all --algo A --json`
    (median of --reps runs per pass, each after a warm-up);
  * PyTorch: torch.nn.functional.conv2d forward + autograd backward with
    torch.set_num_threads(THREADS), median of --reps runs after a warm-up,
    each side in its own process (--torch-sides): torch1.13 = Debian's
    /usr/bin/python3; torch2 (eager NCHW), torch2-cl (channels-last tensors)
    and torch2-compile (torch.compile of the conv, compiled in the warm-up)
    from the peers venv (bench/setup_peers.sh, $CLGRAD_PEERS_VENV or
    /work/venv-peers). The "torch" columns of the table are the fastest
    PyTorch side per layer total; every side is listed below it.
A layer's "fwd+bwd" is forward + backward-filter (+ bias) + backward-data;
conv1 reads the network input, so neither side computes its data gradient.
The fused Winograd algorithms (winograd-fused, winograd4-fused) have no
backward-filter pass: their rows time it with the separate-transform
algorithm of the same tile size (BWDF_FALLBACK), shown under "chosen".

usage: bench/conv_vs_torch.py [--clgrad build/tools/clgrad] [--algos auto,im2col,winograd,winograd4-fused]
                              [--n 128] [--reps 5] [--threads 2] [--devices SEL] [--json]
                              [--torch-sides torch1.13,torch2,torch2-cl,torch2-compile]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

LAYERS = [("conv1", 1, 32, 28), ("conv2", 32, 32, 28), ("conv3", 32, 64, 14), ("conv4", 64, 64, 14)]


def torch_times(n, reps, threads, mode="eager"):
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(threads)
    out = {}
    g = torch.Generator().manual_seed(0)
    conv = F.conv2d
    if mode == "compile":
        conv = torch.compile(F.conv2d)
    fmt = torch.channels_last if mode == "channels-last" else torch.contiguous_format
    for name, c, k, hw in LAYERS:
        x = torch.randn(n, c, hw, hw, generator=g).contiguous(memory_format=fmt)
        w = torch.randn(k, c, 3, 3, generator=g).contiguous(memory_format=fmt).requires_grad_(True)
        b = torch.zeros(k, requires_grad=True)
        x.requires_grad_(name != "conv1")
        dy = torch.randn(n, k, hw, hw, generator=g).contiguous(memory_format=fmt)
        fwd, tot = [], []
        warm = 3 if mode == "compile" else 1
        for i in range(reps + warm):
            t0 = time.perf_counter()
            y = conv(x, w, b, padding=1)
            t1 = time.perf_counter()
            y.backward(dy)
            t2 = time.perf_counter()
            w.grad = None
            b.grad = None
            x.grad = None
            if i >= warm:
                fwd.append((t1 - t0) * 1e3)
                tot.append((t2 - t0) * 1e3)
        out[name] = {"fwd": statistics.median(fwd), "total": statistics.median(tot)}
    return out


TORCH_SIDES = {"torch1.13": ("/usr/bin/python3", "eager"), "torch2": (None, "eager"),
               "torch2-cl": (None, "channels-last"), "torch2-compile": (None, "compile")}


def torch_side(side, n, reps, threads):
    """torch_times of one side in its own process, or None when it cannot run."""
    py, mode = TORCH_SIDES[side]
    if py is None:
        py = os.path.join(os.environ.get("CLGRAD_PEERS_VENV", "/work/venv-peers"), "bin", "python")
    if not os.access(py, os.X_OK):
        print("%s: no interpreter %s (bench/setup_peers.sh)" % (side, py), file=sys.stderr)
        return None
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    res = subprocess.run([py, os.path.abspath(__file__), "--worker", mode, "--n", str(n), "--reps", str(reps),
                          "--threads", str(threads)], capture_output=True, text=True, env=env)
    if res.returncode != 0:
        print("%s failed: %s" % (side, (res.stderr.strip().splitlines() or ["?"])[-1]), file=sys.stderr)
        return None
    r = json.loads(res.stdout.strip().splitlines()[-1])
    r["side"] = side
    return r


# algorithms without a backward-filter pass -> the one timed for it instead
BWDF_FALLBACK = {"winograd-fused": "winograd", "winograd4-fused": "winograd4"}


def clgrad_run(exe, algo, n, reps, devices, passes):
    cmd = [exe, "bench", "conv", "--shapes", "vgg-s", "--n", str(n), "--pass", passes, "--algo", algo,
           "--reps", str(reps), "--json"]
    if devices:
        cmd += ["--devices", devices]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit("clgrad bench failed (%d): %s" % (res.returncode, res.stderr.strip()))
    out = {}
    for line in res.stdout.splitlines():
        if not line.startswith("{"):
            continue
        r = json.loads(line)
        out.setdefault(r["shape"], {})[r["pass"]] = r
    return out


def clgrad_times(exe, algo, n, reps, devices):
    out = clgrad_run(exe, algo, n, reps, devices, "all")
    if algo in BWDF_FALLBACK:
        bf = clgrad_run(exe, BWDF_FALLBACK[algo], n, reps, devices, "bwd-filter")
        for name, p in bf.items():
            r = dict(p["bwd-filter"])
            r["chosen"] = BWDF_FALLBACK[algo]
            out.setdefault(name, {})["bwd-filter"] = r
    table = {}
    for name, *_ in LAYERS:
        p = out.get(name, {})
        fwd = p.get("fwd", {}).get("ms")
        bf = p.get("bwd-filter", {}).get("ms")
        bd = p.get("bwd-data", {}).get("ms") if name != "conv1" else 0.0
        if None in (fwd, bf, bd):
            table[name] = None
            continue
        table[name] = {"fwd": fwd, "total": fwd + bf + bd,
                       "chosen": {k: v.get("chosen", algo) for k, v in p.items()}}
    return table


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--clgrad", default=os.path.join(here, "..", "build", "tools", "clgrad"))
    ap.add_argument("--algos", default="auto,im2col,winograd")
    ap.add_argument("--n", type=int, default=128)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--devices", default=None)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--torch-sides", default="torch1.13,torch2,torch2-cl,torch2-compile")
    ap.add_argument("--worker", choices=["eager", "channels-last", "compile"], help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        import torch
        print(json.dumps({"version": torch.__version__, "times": torch_times(a.n, a.reps, a.threads, a.worker)}))
        return

    algos = [s for s in a.algos.split(",") if s]
    sides = [s for s in a.torch_sides.split(",") if s]
    for s in sides:
        if s not in TORCH_SIDES:
            sys.exit("unknown torch side %s (known: %s)" % (s, ", ".join(TORCH_SIDES)))
    runs = [r for r in (torch_side(s, a.n, a.reps, a.threads) for s in sides) if r]
    if not runs:
        sys.exit("no PyTorch side could run")
    best = min(runs, key=lambda r: sum(t["total"] for t in r["times"].values()))
    th = best["times"]
    cl = {al: clgrad_times(a.clgrad, al, a.n, a.reps, a.devices) for al in algos}

    if a.json:
        print(json.dumps({"n": a.n, "threads": a.threads, "torch": th, "torch_best": best["side"],
                          "torch_sides": runs, "clgrad": cl}))
        return
    print("PyTorch sides (fwd / fwd+bwd ms over the four layers): " + "; ".join(
        "%s %s %.2f / %.2f" % (r["side"], r["version"], sum(t["fwd"] for t in r["times"].values()),
                               sum(t["total"] for t in r["times"].values())) for r in runs))
    print("torch columns below: %s (fastest fwd+bwd)" % best["side"])
    print("VGG-S 3x3 conv layers, batch %d, PyTorch %d threads; ms, median of %d" % (a.n, a.threads, a.reps))
    hdr = "%-7s %12s %12s" % ("layer", "torch fwd", "torch f+b")
    for al in algos:
        hdr += " %12s %12s" % (al + " fwd", al + " f+b")
    print(hdr)
    sums = {"torch": [0.0, 0.0]}
    for al in algos:
        sums[al] = [0.0, 0.0]
    for name, *_ in LAYERS:
        row = "%-7s %12.2f %12.2f" % (name, th[name]["fwd"], th[name]["total"])
        sums["torch"][0] += th[name]["fwd"]
        sums["torch"][1] += th[name]["total"]
        for al in algos:
            t = cl[al].get(name)
            if t is None:
                row += " %12s %12s" % ("n/a", "n/a")
                sums[al] = [float("nan")] * 2
            else:
                row += " %12.2f %12.2f" % (t["fwd"], t["total"])
                sums[al][0] += t["fwd"]
                sums[al][1] += t["total"]
        print(row)
    row = "%-7s %12.2f %12.2f" % ("total", *sums["torch"])
    for al in algos:
        row += " %12.2f %12.2f" % tuple(sums[al])
    print(row)
    for al in algos:
        print("%-10s fwd+bwd vs torch: %.2fx %s" % (al, sums["torch"][1] / sums[al][1],
                                                   "(faster)" if sums[al][1] <= sums["torch"][1] else "(slower)"))
    if "auto" in cl:
        for name, *_ in LAYERS:
            t = cl["auto"].get(name)
            if t:
                print("auto chose for %s: %s" % (name, ", ".join("%s=%s" % kv for kv in sorted(t["chosen"].items()))))


if __name__ == "__main__":
    main()
