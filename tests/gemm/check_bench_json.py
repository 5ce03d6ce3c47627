#!/usr/bin/env python3
"""Runs `clgrad bench gemm --json` on a small shape and checks every line is a
JSON object with the documented keys and plausible values."""
import json
import subprocess
import sys

clgrad = sys.argv[1]
cmd = [clgrad, "bench", "gemm", "--m", "67", "--n", "45", "--k", "93", "--tb", "--batch", "2",
       "--reps", "2", "--devices", "0", "--backend", "all", "--json"]
out = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
if out.returncode != 0:
    print(out.stdout, out.stderr)
    sys.exit(1)
lines = [l for l in out.stdout.splitlines() if l.strip()]
backends = set()
for l in lines:
    o = json.loads(l)
    for k in ("backend", "m", "n", "k", "ms", "gflops", "batch", "tb"):
        assert k in o, (k, l)
    assert (o["m"], o["n"], o["k"], o["batch"], o["tb"]) == (67, 45, 93, 2, 1), l
    assert o["ms"] > 0 and o["gflops"] > 0, l
    assert abs(o["gflops"] - 2 * 67 * 45 * 93 * 2 / (o["ms"] * 1e6)) < 0.02 * o["gflops"] + 0.01, l
    backends.add(o["backend"])
assert "own" in backends, backends
print("backends:", sorted(backends))
