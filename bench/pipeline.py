#!/usr/bin/env python3
"""Pipeline parallelism (issue #22) on PoCL CPU devices, both sides in the
same run: a K-stage pipeline with M micro-batches on POCL_DEVICES="basic
basic" (PoCL's `basic` device runs kernels in the host thread that waits on
its queue: with clgrad's thread per stage the two stages compute side by
side, one core each) against one `basic` device at the same global batch.
Rounds alternate the sides; medians are reported, with the measured bubble
(the stages' idle share, `pipe_bubble` of `clgrad bench train --json`)
against the ideal (K-1)/(M+K-1) of equal stages, and the process's CPU
milliseconds per step (the work a step costs, summed over the stages' threads:
what a loaded machine changes least; the 1-minute load is printed at the start
and the end).

  /usr/bin/python3 bench/pipeline.py --clgrad build/tools/clgrad [--model models/vgg-s.cfg] [--batch 256]
      [--microbatches 8] [--schedule 1f1b] [--repeat 3] [--steps 5] [--against OLD/tools/clgrad]
      [--cuts conv3] [--also-cuts conv3] [--also-set pipe_wdefer=1]

--cuts conv3:0.4 cuts inside conv3 (after 40% of its output channels); the default
partition cuts inside a layer by itself when no layer boundary balances the stages.
--also-cuts CUTS adds the pipeline with those cuts as a third side (e.g. the best
cut between layers against the default one inside a layer). --also-set OPT=V
(repeatable) adds the pipeline with `clgrad --set OPT=V` as one more side each
(e.g. pipe_wdefer=1: dense weight gradients once per step).

--against adds the same pipeline run by another build (a copy of an older
build tree), alternating with this one, to compare changes to the pipeline
under the same load (the bubble is the less load-sensitive figure).

Each round's line gives the side's CPU ms/step and, for a pipeline, the
partition its run chose at creation (the cut or the cut inside a layer with
its channels, and the transfer path: `conv3:32/64 d2d`) and each stage
thread's CPU ms per step (the stages' balance, which load disturbs little;
an --against build older than that logs none); the table counts the
partitions per side. Before the rounds every pipeline side runs once (its own
convolution shapes measured, its layer costs remembered: pipe_cost_memory).

The machine's load changes absolute figures; the ratio of the two sides of
one run is what to compare.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys


def partition(log):
    """The partition a pipeline run chose, from its --verbose log: 'conv3:32/64 d2d' (cut inside conv3 after 32 of
    its 64 output channels, transfers device to device) or 'pool1 host' (cut after pool1, through the host)."""
    cut, path, first = "", "", True
    for line in log.splitlines():
        m = re.search(r"pipeline: cut inside (\S+) after (\d+) of its (\d+)", line)
        if m:
            cut = "%s:%s/%s" % m.groups()
        m = re.search(r"pipeline stage \d+: layers (\S+)\.\.(\S+),.*transfers (device to device|through the host)", line)
        if m:
            path = "d2d" if m.group(3) == "device to device" else "host"
            if first and not cut:
                cut = m.group(2)
            first = False
    return ("%s %s" % (cut, path)).strip()


def stage_cpu(log):
    """The stages' thread CPU ms per step from a pipeline's --verbose log ('136/139'), '' when absent."""
    v = re.findall(r"pipeline stage \d+: ([0-9.]+) ms CPU per step", log)
    return "/".join("%.0f" % float(x) for x in v)


def bench(a, devices, extra, clgrad=None):
    env = dict(os.environ)
    env["POCL_DEVICES"] = devices
    pipe = "--parallel" in extra
    cmd = [clgrad or a.clgrad, "bench", "train", "--model", a.model, "--batch", str(a.batch), "--steps", str(a.steps),
           "--warmup", str(a.warmup), "--json"] + extra + (["--verbose"] if pipe else [])
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit("failed: %s\n%s" % (" ".join(cmd), out.stderr[-2000:]))
    j = json.loads(out.stdout.strip().splitlines()[-1])
    j["partition"] = partition(out.stderr) if pipe else ""
    j["stage_cpu"] = stage_cpu(out.stderr) if pipe else ""
    return j


def loadavg():
    try:
        return open("/proc/loadavg").read().split()[0]
    except OSError:
        return "?"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--clgrad", default="build/tools/clgrad")
    ap.add_argument("--model", default="models/vgg-s.cfg")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--stages", type=int, default=2)
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--schedule", default="1f1b", choices=["1f1b", "gpipe"])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--against", help="another build's clgrad: its pipeline runs too, alternating")
    ap.add_argument("--cuts", help="fixed cuts (clgrad --stages NAMES; default: the measured partition)")
    ap.add_argument("--also-cuts", help="a third side: the pipeline with these cuts")
    ap.add_argument("--also-set", action="append", default=[], metavar="OPT=V",
                    help="one more side per item: the pipeline with clgrad --set OPT=V (e.g. pipe_wdefer=1)")
    a = ap.parse_args()
    K, M = a.stages, a.microbatches
    pipe = ["--devices", "all", "--parallel", "pp=%d" % K, "--microbatches", str(M), "--pipe-schedule", a.schedule]
    if a.cuts:
        pipe += ["--stages", a.cuts]
    pname = "%d basic, pp=%d, M=%d (%d per micro-batch), %s" % (K, K, M, a.batch // M, a.schedule)
    cases = [("1 basic, batch %d" % a.batch, "basic", [], None),
             (pname, " ".join(["basic"] * K), pipe, None)]
    if a.also_cuts:
        alt = [x for x in pipe if x not in ("--stages", a.cuts)] + ["--stages", a.also_cuts]
        cases.append((pname + ", --stages " + a.also_cuts, " ".join(["basic"] * K), alt, None))
    for opt in a.also_set:
        cases.append((pname + ", --set " + opt, " ".join(["basic"] * K), pipe + ["--set", opt], None))
    if a.against:
        cases.append((pname + ", --against build", " ".join(["basic"] * K), pipe, a.against))
    # warm the program and conv-algorithm caches at both batch sizes, one device at a time
    bench(argparse.Namespace(**dict(vars(a), steps=1, warmup=0)), "basic", [])
    bench(argparse.Namespace(**dict(vars(a), steps=1, warmup=0, batch=a.batch // M)), "basic", [])
    for name, dev, extra, exe in cases[1:]:  # the pipelines' own shapes (a cut inside a layer) and remembered costs
        bench(argparse.Namespace(**dict(vars(a), steps=1, warmup=1)), dev, extra, exe)
    load0 = loadavg()
    runs = {}
    for r in range(a.repeat):
        for name, dev, extra, exe in (cases if r % 2 == 0 else list(reversed(cases))):
            j = bench(a, dev, extra, exe)
            runs.setdefault(name, []).append(j)
            print("round %d %-48s %8.1f img/s  bubble %s  CPU %.0f ms/step  %s%s" % (
                r + 1, name, j["images_per_s"], "%.3f" % j["pipe_bubble"] if j["pipe_bubble"] >= 0 else "-",
                j.get("cpu_ms_per_step", 0), j["partition"],
                "  stages' CPU %s ms/step" % j["stage_cpu"] if j["stage_cpu"] else ""), file=sys.stderr)
    base = statistics.median(x["images_per_s"] for x in runs[cases[0][0]])
    print("\n%s, global batch %d, %d timed steps, medians of %d alternating rounds; 1-minute load %s at the "
          "start, %s at the end" % (a.model, a.batch, a.steps, a.repeat, load0, loadavg()))
    print("| configuration | images/s | vs 1 basic | bubble measured | bubble ideal (K-1)/(M+K-1) | CPU ms/step | "
          "partition (rounds) |")
    print("|---|---|---|---|---|---|---|")
    for name, _, extra, _ in cases:
        ips = statistics.median(x["images_per_s"] for x in runs[name])
        bub = [x["pipe_bubble"] for x in runs[name] if x["pipe_bubble"] >= 0]
        cpu = statistics.median(x.get("cpu_ms_per_step", 0) for x in runs[name])
        parts = [x["partition"] for x in runs[name] if x["partition"]]
        part = ", ".join("%s (%d)" % (q, parts.count(q)) for q in sorted(set(parts))) or "-"
        print("| %s | %.1f | %.2fx | %s | %s | %.0f | %s |" % (name, ips, ips / base,
                                                               "%.3f" % statistics.median(bub) if bub else "-",
                                                               "%.3f" % ((K - 1) / (M + K - 1)) if extra else "-",
                                                               cpu, part))


if __name__ == "__main__":
    main()
