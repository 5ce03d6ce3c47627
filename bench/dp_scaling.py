#!/usr/bin/env python3
"""Data-parallel scaling on PoCL CPU devices, both sides in the same run.

PoCL's `basic` device runs kernels in the host thread that waits on its
queue, so POCL_DEVICES="basic basic" with clgrad's host thread per device
gives two devices that really compute side by side (one core each here);
POCL_DEVICES=basic is the one-device baseline. Rounds alternate the sides;
medians are reported.

  /usr/bin/python3 bench/dp_scaling.py --clgrad build/tools/clgrad [--repeat 3] [--steps 20]

Heterogeneous pair: lane 1 posing as a device half as fast
(--set test_slow_lane=1:1.0, a test aid: the lane waits as long again as
it computed). Ideal = lane 0's own throughput + the slowed lane's own
throughput (each measured alone); the speed-weighted split (auto) is
compared with it and with an even split. `basic pthread` (a pthread device
with its default workers beside a basic one: unequal devices competing for
the two cores) is reported beside it.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys


def bench(clgrad, model, batch, steps, devices, options, split=None):
    env = dict(os.environ)
    env["POCL_DEVICES"] = devices
    cmd = [clgrad, "bench", "train", "--model", model, "--batch", str(batch), "--steps", str(steps),
           "--warmup", "5", "--json"]
    for kv in options.items():
        cmd += ["--set", "%s=%s" % kv]
    if split:
        cmd += ["--split", split]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit("failed: %s\n%s" % (" ".join(cmd), out.stderr[-2000:]))
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--clgrad", default="build/tools/clgrad")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--models", default="models/vgg-s.cfg,models/lenet5.cfg")
    ap.add_argument("--skip-hetero", action="store_true")
    a = ap.parse_args()
    slow = {"test_slow_lane": "1:1.0"}
    for model in a.models.split(","):
        # warm the program and conv-algorithm caches for both batch sizes a device sees, one device
        # at a time, so algorithm timing is not done while another device competes for the cores
        for b in (a.batch, a.batch // 2):
            bench(a.clgrad, model, b, 2, "basic", {})
        bench(a.clgrad, model, a.batch, 2, "basic basic", {}, "even")
        runs = {}
        cases = [("1 basic", "basic", {}, None), ("2 basic", "basic basic", {}, None)]
        if not a.skip_hetero:
            cases += [
                ("lane 0 alone", "basic", {}, None),
                ("slowed lane alone", "basic", {"test_slow_lane": "0:1.0"}, None),
                ("2 basic, lane 1 slowed, split auto", "basic basic", slow, None),
                ("2 basic, lane 1 slowed, split even", "basic basic", slow, "even"),
                ("basic + pthread, split auto", "basic pthread", {}, None),
                ("basic + pthread, split even", "basic pthread", {}, "even"),
            ]
        for r in range(a.repeat):
            order = cases if r % 2 == 0 else list(reversed(cases))
            for name, dev, env, split in order:
                j = bench(a.clgrad, model, a.batch, a.steps, dev, env, split)
                runs.setdefault(name, []).append(j)
                print("%s round %d %-38s %8.1f img/s  shares %s" % (model, r + 1, name, j["images_per_s"],
                                                                   j.get("shares", "")), file=sys.stderr)
        med = {k: statistics.median(x["images_per_s"] for x in v) for k, v in runs.items()}
        print("\n%s, batch %d, %d timed steps, medians of %d alternating rounds" % (model, a.batch, a.steps,
                                                                                   a.repeat))
        print("| configuration | images/s | vs 1 basic | shares (last round) |")
        print("|---|---:|---:|---|")
        for k in runs:
            print("| %s | %.0f | %.2fx | %s |" % (k, med[k], med[k] / med["1 basic"], runs[k][-1].get("shares", "")))
        if not a.skip_hetero:
            ideal = med["lane 0 alone"] + med["slowed lane alone"]
            auto = med["2 basic, lane 1 slowed, split auto"]
            even = med["2 basic, lane 1 slowed, split even"]
            print("heterogeneous: ideal (sum of the lanes alone) %.0f img/s; speed-weighted split %.0f = %.2fx ideal, "
                  "%.2fx the even split (%.0f)" % (ideal, auto, auto / ideal, auto / even, even))


if __name__ == "__main__":
    main()
