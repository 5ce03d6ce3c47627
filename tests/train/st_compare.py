#!/usr/bin/env python3
"""Compares the tensors of two safetensors files (clgrad checkpoints).
Usage: st_compare.py A B TOL   -> exit 0 when every tensor of A exists in B
with the same shape and max |a - b| <= TOL * (1 + max |a|) (TOL 0: bitwise
equal bytes); prints the worst tensor. Plain Python (no numpy needed)."""
import json
import struct
import sys


def load(path):
    with open(path, "rb") as f:
        raw = f.read()
    (hlen,) = struct.unpack("<Q", raw[:8])
    head = json.loads(raw[8:8 + hlen])
    base = 8 + hlen
    out = {}
    for name, t in head.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        out[name] = (t["dtype"], t["shape"], raw[base + a:base + b])
    return out


def floats(blob):
    return struct.unpack("<%df" % (len(blob) // 4), blob)


a, b, tol = load(sys.argv[1]), load(sys.argv[2]), float(sys.argv[3])
worst, worst_name, bad = 0.0, "", 0
if not a:
    print("no tensors in", sys.argv[1])
    sys.exit(1)
for name, (dt, shape, blob) in a.items():
    if name not in b or b[name][1] != shape or b[name][0] != dt:
        print("tensor %s missing or of another shape in %s" % (name, sys.argv[2]))
        sys.exit(1)
    if tol == 0:
        if blob != b[name][2]:
            print("tensor %s differs (bitwise)" % name)
            bad += 1
        continue
    x, y = floats(blob), floats(b[name][2])
    scale = 1 + max(abs(v) for v in x)
    d = max(abs(p - q) for p, q in zip(x, y)) / scale
    if d > worst:
        worst, worst_name = d, name
    if d > tol:
        bad += 1
if tol == 0:
    print("%d tensors, %d differ bitwise" % (len(a), bad))
else:
    print("%d tensors, worst %s: max |a-b| / (1 + max |a|) = %.3g (tolerance %g)" % (len(a), worst_name, worst, tol))
sys.exit(1 if bad else 0)
