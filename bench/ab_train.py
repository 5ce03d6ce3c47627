#!/usr/bin/env python3
"""Alternating A/B training throughput of two clgrad builds (same session, same load).

usage: bench/ab_train.py --a BUILD_A/tools/clgrad --b BUILD_B/tools/clgrad [--rounds 3]
       [--models lenet5,vgg-s,resnet-mini] [--steps 20] [--warmup 3] [--devices 0]
Each round runs every model on A, then on B (then B first in the next round), each a fresh
process of `clgrad bench train --json`; prints per-round images/s, the medians and B/A.
A warm-up run of each build fills its caches first (not counted). Records lscpu's model and
the PoCL version beside the figures."""
import argparse, json, statistics, subprocess, sys

def run(binary, model, a):
    cmd = [binary, "bench", "train", "--model", "models/%s.cfg" % model, "--steps", str(a.steps),
           "--warmup", str(a.warmup), "--devices", a.devices, "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    line = [l for l in out.splitlines() if l.startswith("{")][-1]
    return json.loads(line)["images_per_s"]

def main():
    p = argparse.ArgumentParser()
    p.add_argument("--a", required=True); p.add_argument("--b", required=True)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--models", default="lenet5,vgg-s,resnet-mini")
    p.add_argument("--steps", type=int, default=20); p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--devices", default="0")
    a = p.parse_args()
    cpu = [l.split(":", 1)[1].strip() for l in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines()
           if l.startswith("Model name")]
    pocl = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "libpocl2"], capture_output=True, text=True).stdout
    print("cpu: %s; pocl %s" % (cpu[0] if cpu else "?", pocl))
    models = a.models.split(",")
    for m in models:  # fill caches
        run(a.a, m, a); run(a.b, m, a)
    res = {m: {"a": [], "b": []} for m in models}
    for r in range(a.rounds):
        order = ("a", "b") if r % 2 == 0 else ("b", "a")
        for m in models:
            for side in order:
                v = run(getattr(a, side), m, a)
                res[m][side].append(v)
                print("round %d %-12s %s %10.1f images/s" % (r + 1, m, side, v), flush=True)
    print("\n| model | A images/s (median) | B images/s (median) | B/A |")
    print("|---|---:|---:|---:|")
    for m in models:
        ma, mb = statistics.median(res[m]["a"]), statistics.median(res[m]["b"])
        print("| %s | %.0f (%s) | %.0f (%s) | %.3f |" % (m, ma, ", ".join("%.0f" % x for x in res[m]["a"]), mb,
              ", ".join("%.0f" % x for x in res[m]["b"]), mb / ma))

if __name__ == "__main__":
    sys.exit(main())
