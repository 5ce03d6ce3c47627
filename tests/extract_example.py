#!/usr/bin/env python3
"""Extracts the worked example from the overview comment of include/clgrad.h
so a test compiles and runs exactly what the header shows."""
import sys

src, out = sys.argv[1], sys.argv[2]
lines = open(src, encoding="utf-8").read().splitlines()
start = next(i for i, l in enumerate(lines) if "#include <clgrad.h>" in l)
code = []
for l in lines[start:]:
    if l.strip().startswith("*/"):
        break
    code.append(l[3:] if l.startswith(" * ") else l.lstrip(" *"))
with open(out, "w", encoding="utf-8") as f:
    f.write("\n".join(code) + "\n")
