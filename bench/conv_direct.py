#!/usr/bin/env python3
"""Shape-specialised direct convolution against the other algorithms on the
layers it was written for: the first layers and 5x5 windows of LeNet-5, the
strided layers of resnet-mini, and the weight gradients of VGG-S and
resnet-mini. Each (layer, pass, algorithm) runs in its own `clgrad bench conv
--json` process (median of --reps runs inside), algorithms in alternating
order from round to round; the table shows the median over --rounds rounds
in ms and the speed-up of direct over the best other algorithm.

usage: python3 bench/conv_direct.py [--clgrad build/tools/clgrad] [--rounds 3] [--reps 5] [--n 128]
"""
import argparse
import json
import statistics
import subprocess
import sys

# name, (c, h, w, k, r, s, pad, stride), passes, other algorithms
LAYERS = [
    ("lenet conv1 1->6 5x5 @28", (1, 28, 28, 6, 5, 5, 2, 1), ["fwd", "bwd-filter"], ["im2col"]),
    ("lenet conv2 6->16 5x5 @14", (6, 14, 14, 16, 5, 5, 0, 1), ["fwd", "bwd-data", "bwd-filter"], ["im2col"]),
    ("resnet b2_conv1 16->32 3x3/2 @28", (16, 28, 28, 32, 3, 3, 1, 2), ["fwd", "bwd-data", "bwd-filter"], ["im2col"]),
    ("resnet b2_proj 16->32 1x1/2 @28", (16, 28, 28, 32, 1, 1, 0, 2), ["fwd", "bwd-data", "bwd-filter"], ["im2col"]),
    ("resnet b1 16->16 3x3 @28", (16, 28, 28, 16, 3, 3, 1, 1), ["bwd-filter"], ["winograd4", "im2col"]),
    ("vgg conv1 1->32 3x3 @28", (1, 28, 28, 32, 3, 3, 1, 1), ["fwd", "bwd-filter"], ["im2col", "winograd4-fused"]),
    ("vgg conv2 32->32 3x3 @28", (32, 28, 28, 32, 3, 3, 1, 1), ["bwd-filter"], ["winograd4"]),
    ("vgg conv3 32->64 3x3 @14", (32, 14, 14, 64, 3, 3, 1, 1), ["bwd-filter"], ["winograd4"]),
    ("vgg conv4 64->64 3x3 @14", (64, 14, 14, 64, 3, 3, 1, 1), ["bwd-filter"], ["winograd4"]),
]


def run(clgrad, n, shape, pss, algo, reps):
    c, h, w, k, r, s, pad, stride = shape
    cmd = [clgrad, "bench", "conv", "--n", str(n), "--c", str(c), "--h", str(h), "--w", str(w), "--k", str(k),
           "--r", str(r), "--s", str(s), "--pad", str(pad), "--stride", str(stride), "--pass", pss, "--algo", algo,
           "--reps", str(reps), "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    for line in out.stdout.splitlines():
        if line.startswith("{"):
            return json.loads(line)["ms"]
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--clgrad", default="build/tools/clgrad")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--n", type=int, default=128)
    a = ap.parse_args()
    times = {}
    for rnd in range(a.rounds):
        for name, shape, passes, others in LAYERS:
            for pss in passes:
                algos = ["direct"] + others
                if rnd % 2:
                    algos.reverse()
                for algo in algos:
                    ms = run(a.clgrad, a.n, shape, pss, algo, a.reps)
                    times.setdefault((name, pss, algo), []).append(ms)
        print(f"round {rnd + 1} done", file=sys.stderr)
    print("| layer | pass | direct ms | other algorithms ms | direct speed-up over the best other |")
    print("|---|---|---:|---|---:|")
    for name, shape, passes, others in LAYERS:
        for pss in passes:
            def med(algo):
                v = [t for t in times[(name, pss, algo)] if t is not None]
                return statistics.median(v) if v else None
            d = med("direct")
            o = {alg: med(alg) for alg in others}
            best = min((t for t in o.values() if t is not None), default=None)
            other_s = ", ".join(f"{alg} {t:.2f}" if t is not None else f"{alg} n/a" for alg, t in o.items())
            sp = f"{best / d:.2f}x" if d and best else "n/a"
            print(f"| {name} | {pss} | {d:.2f} | {other_s} | {sp} |" if d else f"| {name} | {pss} | n/a | {other_s} | n/a |")


if __name__ == "__main__":
    main()
