#!/usr/bin/env python3
"""Where a step's time goes, from a clgrad --trace file.

  /usr/bin/python3 bench/trace_summary.py TRACE.json [--steps N]

Per device lane: milliseconds per step spent in forward and backward
(summed over layers), the optimizer, uploads, gradient bucket reads and
write-backs, and on the host waiting for its own buckets, summing buckets,
waiting for the other lanes' sums and meeting new per-device batch sizes
between steps; the gap between a step's optimizer and the next step's
first forward (the hand-over through the host thread: the step's end, the
next batch's upload, the lanes' start); plus the span of a step on that lane, the reduction (reads,
sums, write-backs) and the busy fraction (compute over span: what survives a
loaded machine better than throughput), and how often the lane was the last
to finish its backward (it sums the last bucket, the others wait for it): near
1/lanes each when the lanes only jitter, near 1 for one lane when it is
slower every step. summarize() serves dp_scaling.py.

A pipeline's trace (--parallel pp=K: a row per stage, spans "forward M",
"backward M", "re-run forward M", "weight gradients", "late weight
gradients M", "wait activation M", "wait gradient M", "send activation M",
"send gradient M") gets a table of its own: per stage ms per step of each
kind, the span and the busy share (forward, backward and weight gradients
less the waits, over the span: a forward's span holds its wait for the
activation and its sends, a backward's its wait for the gradient, re-run
forward, sends and the weight gradients run after the sends (pipe_wlate:
listed apart, not added again); the sends include the clFinish that runs a
`basic` device's kernels).
"""
import argparse
import json
from collections import defaultdict


KEYS = ["forward", "backward", "optimizer", "upload", "grad read", "grad write", "host: wait own buckets",
        "host: sum buckets", "host: wait for other lanes", "host: prepare new batch sizes"]


def summarize(path, nsteps=0):
    """{lane name: {key: ms per step}} plus per lane "span" (ms per step), "busy" (forward + backward +
    optimizer over the span) and "reduction" (bucket reads, sums and write-backs, ms per step)."""
    d = json.load(open(path))
    names = {}
    tot = defaultdict(lambda: defaultdict(float))
    steps = defaultdict(int)
    first = {}
    last = {}
    gap = defaultdict(float)  # per lane: from a step's optimizer end to the next step's first forward
    opt_end = {}
    last_b = max([int(e["name"].split()[2]) for e in d["traceEvents"]
                  if e["ph"] == "X" and e["name"].startswith("sum bucket ")] or [-1])
    sums_last = defaultdict(int)  # per lane: steps in which it summed the last bucket (it finished last)
    for e in sorted((e for e in d["traceEvents"] if e["ph"] == "X"), key=lambda e: e["ts"]):
        if e["name"] == "optimizer":
            opt_end[e["pid"]] = e["ts"] + e["dur"]
        elif e["name"].startswith("fwd ") and e["pid"] in opt_end:
            gap[e["pid"]] += max(0.0, e["ts"] - opt_end.pop(e["pid"])) / 1000.0
    for e in d["traceEvents"]:
        if e["ph"] == "M" and e["name"] == "process_name":
            names[e["pid"]] = e["args"]["name"]
        if e["ph"] != "X":
            continue
        lane, n, ms = e["pid"], e["name"], e["dur"] / 1000.0
        first[lane] = min(first.get(lane, e["ts"]), e["ts"])
        last[lane] = max(last.get(lane, 0), e["ts"] + e["dur"])
        if n.startswith("fwd "):
            k = "forward"
        elif n.startswith("bwd "):
            k = "backward"
        elif n == "optimizer":
            k = "optimizer"
            steps[lane] += 1
        elif n == "upload":
            k = "upload"
        elif n.startswith("grad read"):
            k = "grad read"
        elif n.startswith("grad write") or n.startswith("grad copy"):
            k = "grad write"
        elif n.startswith("wait own"):
            k = "host: wait own buckets"
        elif n.startswith("sum bucket"):
            k = "host: sum buckets"
            sums_last[lane] += n == "sum bucket %d" % last_b
        elif n.startswith("wait sum"):
            k = "host: wait for other lanes"
        elif n.startswith("prepare"):
            k = "host: prepare new batch sizes"
        else:
            k = n
        tot[lane][k] += ms
    out = {}
    for l in sorted(tot):
        s = nsteps or max(steps[l], 1)
        row = {k: v / s for k, v in tot[l].items()}
        row["span"] = (last[l] - first[l]) / 1000.0 / s
        row["between steps"] = gap[l] / s
        row["busy"] = (row.get("forward", 0) + row.get("backward", 0) + row.get("optimizer", 0)) / max(row["span"], 1e-9)
        row["reduction"] = row.get("grad read", 0) + row.get("host: sum buckets", 0) + row.get("grad write", 0)
        row["last"] = sums_last[l] / s
        out[names.get(l, "lane %d" % l)] = row
    return out


PIPE_KEYS = ["forward", "backward", "re-run forward", "weight gradients", "late weight gradients", "wait activation",
             "wait gradient", "send activation", "send gradient"]


def summarize_pipeline(path):
    """{stage name: {key: ms per step}} of a pipeline trace (steps: the stage's "backward 0" spans); {} when the
    trace has no pipeline rows."""
    d = json.load(open(path))
    names = {e["pid"]: e["args"]["name"] for e in d["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"}
    tot = defaultdict(lambda: defaultdict(float))
    steps = defaultdict(int)
    span = {}
    for e in d["traceEvents"]:
        if e["ph"] != "X":
            continue
        k = e["name"].rstrip("0123456789").rstrip()
        if k not in PIPE_KEYS:
            continue
        pid = e["pid"]
        tot[pid][k] += e["dur"] / 1000.0
        steps[pid] += e["name"] == "backward 0"
        a, b = span.get(pid, (e["ts"], e["ts"] + e["dur"]))
        span[pid] = (min(a, e["ts"]), max(b, e["ts"] + e["dur"]))
    out = {}
    for pid in sorted(tot):
        s = max(steps[pid], 1)
        row = {k: v / s for k, v in tot[pid].items()}
        row["span"] = (span[pid][1] - span[pid][0]) / 1000.0 / s
        work = sum(row.get(k, 0) for k in ("forward", "backward", "weight gradients")) - \
            row.get("wait activation", 0) - row.get("wait gradient", 0)
        row["busy"] = work / max(row["span"], 1e-9)
        out[names.get(pid, "stage %d" % pid)] = row
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--steps", type=int, default=0, help="steps in the trace (default: counted optimizer spans)")
    a = ap.parse_args()
    stages = summarize_pipeline(a.trace)
    if stages:
        print("| ms per step | " + " | ".join(stages) + " |")
        print("|---|" + "---:|" * len(stages))
        for k in PIPE_KEYS + ["span"]:
            print("| %s | %s |" % (k, " | ".join("%.2f" % r.get(k, 0.0) for r in stages.values())))
        print("| busy (compute / span) | %s |" % " | ".join("%.1f%%" % (100 * r["busy"]) for r in stages.values()))
        return
    lanes = summarize(a.trace, a.steps)
    print("| ms per step | " + " | ".join(lanes) + " |")
    print("|---|" + "---:|" * len(lanes))
    for k in KEYS + ["between steps", "span", "reduction"]:
        print("| %s | %s |" % (k, " | ".join("%.2f" % r.get(k, 0.0) for r in lanes.values())))
    print("| busy (compute / span) | %s |" % " | ".join("%.1f%%" % (100 * r["busy"]) for r in lanes.values()))
    print("| last to finish backward | %s |" % " | ".join("%.0f%%" % (100 * r["last"]) for r in lanes.values()))


if __name__ == "__main__":
    main()
