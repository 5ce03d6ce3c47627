#!/usr/bin/env python3
"""Fails when a C function in src/ or tools/ is longer than the limit (issue 21: 120 lines).

A function is counted from the line that opens its body with '{' in column 0
to the next line with '}' in column 0 (the project's formatting puts both
there). usage: tests/func_length.py SOURCE_ROOT [--limit N] [--top K]"""
import os
import re
import sys


def functions(path):
    lines = open(path, errors="replace").read().split("\n")
    start = None
    for i, line in enumerate(lines):
        if line.startswith("{") and start is None:
            j = i - 1
            while j >= 0 and "(" not in lines[j]:
                j -= 1
            m = re.search(r"(\w+)\s*\(", lines[j]) if j >= 0 else None
            name, start = (m.group(1) if m else "?"), i
        elif line.startswith("}") and start is not None:
            yield name, start + 1, i - start + 1
            start = None


def main():
    args = sys.argv[1:]
    root = args[0] if args else "."
    limit = int(args[args.index("--limit") + 1]) if "--limit" in args else 120
    top = int(args[args.index("--top") + 1]) if "--top" in args else 0
    found = []
    for sub in ("src", "tools"):
        for dp, _, fns in os.walk(os.path.join(root, sub)):
            for fn in sorted(fns):
                if fn.endswith(".c"):
                    p = os.path.join(dp, fn)
                    found += [(n, os.path.relpath(p, root), line, name) for name, line, n in functions(p)]
    found.sort(reverse=True)
    for n, p, line, name in found[:top]:
        print("%4d %s:%d %s" % (n, p, line, name))
    over = [f for f in found if f[0] > limit]
    for n, p, line, name in over:
        print("%s:%d: %s is %d lines (limit %d): split it into named steps" % (p, line, name, n, limit))
    print("func_length: %d functions, longest %d lines, %d over %d" % (len(found), found[0][0] if found else 0,
                                                                        len(over), limit))
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
