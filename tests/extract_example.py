#!/usr/bin/env python3
"""Extracts the worked example from the overview comment of a public header
(include/clgrad.h, include/clgrad_prim.h) so a test compiles and runs exactly
what the header shows. usage: extract_example.py HEADER OUT [FIRST_LINE_MARKER]"""
import sys

src, out = sys.argv[1], sys.argv[2]
lines = open(src, encoding="utf-8").read().splitlines()
marker = sys.argv[3] if len(sys.argv) > 3 else "#include <clgrad.h>"
start = next(i for i, l in enumerate(lines) if marker in l)
code = []
for l in lines[start:]:
    if l.strip().startswith("*/"):
        break
    code.append(l[3:] if l.startswith(" * ") else l.lstrip(" *"))
with open(out, "w", encoding="utf-8") as f:
    f.write("\n".join(code) + "\n")
