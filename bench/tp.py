#!/usr/bin/env python3
"""Tensor parallelism (issue #22) on PoCL CPU devices, both sides in the
same run: --parallel tp=T on POCL_DEVICES="basic basic" (PoCL's `basic`
device runs kernels in the host thread that waits on its queue: with
clgrad's thread per lane the two halves of each split layer compute side by
side, one core each) against one `basic` device at the same batch. Rounds
alternate the sides; medians are reported.

  /usr/bin/python3 bench/tp.py --clgrad build/tools/clgrad [--model models/mlp-wide.cfg] [--batch 256]
      [--tp 2] [--repeat 3] [--steps 5]

The machine's load changes absolute figures; the ratio of the two sides of
one run is what to compare (the load average is printed with it).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys


def bench(a, devices, extra):
    env = dict(os.environ)
    env["POCL_DEVICES"] = devices
    cmd = [a.clgrad, "bench", "train", "--model", a.model, "--batch", str(a.batch), "--steps", str(a.steps),
           "--warmup", str(a.warmup), "--json"] + extra
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit("failed: %s\n%s" % (" ".join(cmd), out.stderr[-2000:]))
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--clgrad", default="build/tools/clgrad")
    ap.add_argument("--model", default="models/mlp-wide.cfg")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    a = ap.parse_args()
    T = a.tp
    cases = [("1 basic, batch %d" % a.batch, "basic", ["--devices", "0"]),
             ("%d basic, tp=%d" % (T, T), " ".join(["basic"] * T), ["--devices", "all", "--parallel", "tp=%d" % T])]
    bench(argparse.Namespace(**dict(vars(a), steps=1, warmup=0)), "basic", [])  # warm the program cache
    runs = {}
    for r in range(a.repeat):
        for name, dev, extra in (cases if r % 2 == 0 else list(reversed(cases))):
            j = bench(a, dev, extra)
            runs.setdefault(name, []).append(j)
            print("round %d %-24s %8.1f img/s  (load average %.2f)" % (r + 1, name, j["images_per_s"],
                                                                       os.getloadavg()[0]), file=sys.stderr)
    base = statistics.median(x["images_per_s"] for x in runs[cases[0][0]])
    print("\n%s, batch %d, %d timed steps, medians of %d alternating rounds (load average %.2f on %d CPUs)" %
          (a.model, a.batch, a.steps, a.repeat, os.getloadavg()[0], os.cpu_count()))
    print("| configuration | images/s | vs 1 basic |")
    print("|---|---|---|")
    for name, _, _ in cases:
        ips = statistics.median(x["images_per_s"] for x in runs[name])
        print("| %s | %.1f | %.2fx |" % (name, ips, ips / base))


if __name__ == "__main__":
    main()
