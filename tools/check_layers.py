#!/usr/bin/env python3
"""Checks that src/ keeps its layers: a file of folder F includes headers of F
and of the folders F may use, nothing else of src/.

The layers come from src/meson.build (clg_layers), passed as arguments
"folder=used,used" bottom up; a folder may use the folders it names and
everything those may use. Quoted includes are resolved the way the compiler
finds them: next to the including file, then under src/ ("model/layers.h",
"src/onnx/onnx.pb-c.h" from the build root); includes of include/ and of the
build root's generated headers (clg_config.h) belong to no folder.

    check_layers.py --src DIR [--stamp OUT --depfile D] core= io=core ...

Exit 0 and the stamp written when clean; exit 1 with one line per upward
include ("src/parallel/lane.h includes train/optim.h: parallel may not depend
on train") otherwise. Also importable (tests/arch_check.py)."""
import argparse
import os
import re
import subprocess
import sys

KNOWN_VIOLATIONS = set()  # upward includes tolerated: none
KNOWN_SYMBOL_VIOLATIONS = set()  # (folder, folder it may not use) tolerated: none

INCLUDE_RE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)


def parse_layers(args):
    """["core=", "io=core", ...] -> ordered list of (folder, [uses])."""
    layers = []
    for a in args:
        if "=" not in a:
            raise ValueError("layer argument '%s' is not folder=used,used" % a)
        name, uses = a.split("=", 1)
        layers.append((name, [u for u in uses.split(",") if u]))
    seen = set()
    for name, uses in layers:
        for u in uses:
            if u not in seen:
                raise ValueError("layer '%s' uses '%s', which is not a layer below it" % (name, u))
        seen.add(name)
    return layers


def closure(layers):
    """folder -> set of folders it may include (itself, what it uses, theirs)."""
    allowed = {}
    for name, uses in layers:
        s = {name}
        for u in uses:
            s |= allowed[u]
        allowed[name] = s
    return allowed


def source_files(src, folders):
    out = []
    for f in folders:
        d = os.path.join(src, f)
        if not os.path.isdir(d):
            continue
        for root, _, names in os.walk(d):
            for n in sorted(names):
                if n.endswith((".c", ".h")):
                    out.append(os.path.join(root, n))
    return sorted(out)


def folder_of_include(src, including, inc, folders):
    """The src/ folder a quoted include resolves to, or None (public or generated header)."""
    local = os.path.normpath(os.path.join(os.path.dirname(including), inc))
    if os.path.isfile(local):
        rel = os.path.relpath(local, src)
    else:
        rel = inc[4:] if inc.startswith("src/") else inc
    first = rel.split("/", 1)[0]
    if "/" in rel and first in folders:
        return first, rel
    return None, rel


def check(src, layers, known=KNOWN_VIOLATIONS):
    """-> (errors, files read, known violations seen)."""
    folders = [n for n, _ in layers]
    allowed = closure(layers)
    errors, seen_known = [], set()
    files = source_files(src, folders)
    for path in files:
        rel_path = "src/" + os.path.relpath(path, src)
        me = os.path.relpath(path, src).split("/", 1)[0]
        with open(path, encoding="utf-8", errors="replace") as fh:
            text = fh.read()
        for inc in INCLUDE_RE.findall(text):
            other, rel = folder_of_include(src, path, inc, folders)
            if other is None or other in allowed[me]:
                continue
            if (rel_path, inc) in known:
                seen_known.add((rel_path, inc))
                continue
            errors.append("%s includes %s: %s may not depend on %s (%s may use: %s)" %
                          (rel_path, inc, me, other, me,
                           ", ".join(sorted(allowed[me] - {me})) or "nothing"))
    return errors, files, seen_known


def lib_symbols(path, nm="nm"):
    """-> (defined, undefined) global symbols of a static library."""
    out = subprocess.run([nm, "-g", path], check=True, capture_output=True, text=True).stdout
    defined, undefined = set(), set()
    for line in out.splitlines():
        p = line.split()
        if len(p) == 3 and p[1] in "TDBRCVW":
            defined.add(p[2])
        elif len(p) == 2 and p[0] == "U":
            undefined.add(p[1])
    return defined, undefined


def check_symbols(libs, layers, known=KNOWN_SYMBOL_VIOLATIONS):
    """libs: folder -> its static library. A folder's library may refer only
    to symbols of its own folder, of the folders it may use, or of no folder
    (OpenCL, libc, ...). -> (errors, known violations seen)."""
    allowed = closure(layers)
    syms = {name: lib_symbols(path) for name, path in libs.items()}
    owner = {}
    for name, (defined, _) in syms.items():
        for sym in defined:
            owner.setdefault(sym, name)
    errors, seen_known = [], set()
    for name, (_, undefined) in syms.items():
        for sym in sorted(undefined):
            o = owner.get(sym)
            if o is None or o in allowed[name]:
                continue
            if (name, o) in known:
                seen_known.add((name, o))
                continue
            errors.append("libclg_%s refers to %s of %s: %s may not depend on %s" % (name, sym, o, name, o))
    return errors, seen_known


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--src", required=True, help="the src/ directory")
    ap.add_argument("--stamp", help="written when the check passes")
    ap.add_argument("--depfile", help="Make-style list of the files read")
    ap.add_argument("layers", nargs="+", help="folder=used,used (bottom up, from src/meson.build)")
    a = ap.parse_args(argv)
    try:
        layers = parse_layers(a.layers)
    except ValueError as e:
        print("check_layers: %s" % e, file=sys.stderr)
        return 1
    errors, files, seen_known = check(a.src, layers)
    for e in errors:
        print(e, file=sys.stderr)
    for k in sorted(KNOWN_VIOLATIONS - seen_known):
        print("check_layers: note: allow-listed %s -> %s no longer occurs; remove it from KNOWN_VIOLATIONS" % k,
              file=sys.stderr)
    if errors:
        print("check_layers: %d include(s) run upward (layers: src/meson.build clg_layers)" % len(errors),
              file=sys.stderr)
        return 1
    if a.depfile and a.stamp:
        with open(a.depfile, "w") as fh:
            # the folders too: a file added or removed changes its folder's time
            deps = [os.path.join(a.src, "meson.build")] + [os.path.join(a.src, n) for n, _ in layers] + files
            fh.write("%s: %s\n" % (a.stamp.replace(" ", "\\ "), " \\\n ".join(d.replace(" ", "\\ ") for d in deps)))
    if a.stamp:
        with open(a.stamp, "w") as fh:
            fh.write("/* src/ keeps its layers (tools/check_layers.py): %d files checked */\n" % len(files))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
