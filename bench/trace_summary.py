#!/usr/bin/env python3
"""Where a step's time goes, from a clgrad --trace file.

  /usr/bin/python3 bench/trace_summary.py TRACE.json [--steps N]

Per device lane: milliseconds per step spent in forward and backward
(summed over layers), the optimizer, uploads, gradient bucket reads and
write-backs, and on the host waiting for its own buckets, summing buckets
and waiting for the other lanes' sums; plus the span of a step on that lane.
"""
import argparse
import json
from collections import defaultdict


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--steps", type=int, default=0, help="steps in the trace (default: counted optimizer spans)")
    a = ap.parse_args()
    d = json.load(open(a.trace))
    names = {}
    tot = defaultdict(lambda: defaultdict(float))
    steps = defaultdict(int)
    first = {}
    last = {}
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
        elif n.startswith("grad write"):
            k = "grad write"
        elif n.startswith("wait own"):
            k = "host: wait own buckets"
        elif n.startswith("sum bucket"):
            k = "host: sum buckets"
        elif n.startswith("wait sum"):
            k = "host: wait for other lanes"
        else:
            k = n
        tot[lane][k] += ms
    keys = ["forward", "backward", "optimizer", "upload", "grad read", "grad write", "host: wait own buckets",
            "host: sum buckets", "host: wait for other lanes"]
    print("| ms per step | " + " | ".join(names.get(l, "lane %d" % l) for l in sorted(tot)) + " |")
    print("|---|" + "---:|" * len(tot))
    for k in keys + ["span"]:
        row = []
        for l in sorted(tot):
            s = a.steps or max(steps[l], 1)
            v = (last[l] - first[l]) / 1000.0 if k == "span" else tot[l].get(k, 0.0)
            row.append("%.2f" % (v / s))
        print("| %s | %s |" % (k, " | ".join(row)))


if __name__ == "__main__":
    main()
