#!/usr/bin/env python3
"""The layering of src/ as the build declares it (src/meson.build clg_layers,
passed here as "folder=used,used" arguments bottom up) against the code and
docs/ARCHITECTURE.md:

1. tools/check_layers.py finds no upward include in src/ (the build step runs
   the same check) and does find one planted in a scratch copy of a folder;
   no folder's static library refers to a symbol of a folder it may not use;
2. every folder of src/ with code is a layer and every layer a folder;
3. the table "Layers of the code" in docs/ARCHITECTURE.md lists the same
   folders in the same order, each with the same "uses" column.

    arch_check.py SRC_DIR ARCHITECTURE.md CHECK_LAYERS.py [--lib LIB]... core= io=core ...

(one --lib per layer, in the layers' order: libclg_<folder>.a)
"""
import importlib.util
import os
import re
import shutil
import sys
import tempfile

failures = []


def fail(msg):
    failures.append(msg)
    print("FAIL: " + msg)


def load_checker(path):
    spec = importlib.util.spec_from_file_location("check_layers", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def check_includes(cl, src, layers):
    errors, files, _ = cl.check(src, layers)
    for e in errors:
        fail(e)
    if not files:
        fail("no source files found under %s" % src)
    # The checker must catch an upward include: plant one in a scratch copy
    # of the lowest folder (it may use nothing) naming the top folder.
    low, top = layers[0][0], layers[-1][0]
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copytree(os.path.join(src, low), os.path.join(tmp, low))
        with open(os.path.join(tmp, low, "zz_planted.c"), "w") as fh:
            fh.write('#include "%s/planted.h"\n' % top)
        errs, _, _ = cl.check(tmp, layers, known=set())
        want = "src/%s/zz_planted.c includes %s/planted.h: %s may not depend on %s" % (low, top, low, top)
        if not any(e.startswith(want) for e in errs):
            fail("the checker missed a planted upward include (wanted '%s', got %s)" % (want, errs))
    # a layer naming one that is not below it is refused
    try:
        cl.parse_layers(["a=b", "b="])
        fail("parse_layers accepted a layer that uses one above it")
    except ValueError:
        pass


def check_libs(cl, libs, layers):
    if not libs:
        return
    if len(libs) != len(layers):
        fail("%d libraries for %d layers" % (len(libs), len(layers)))
        return
    for lib, (name, _) in zip(libs, layers):
        if os.path.basename(lib) != "libclg_%s.a" % name:
            fail("library %s is not layer %s's (libclg_%s.a)" % (lib, name, name))
            return
    errors, _ = cl.check_symbols(dict(zip([n for n, _ in layers], libs)), layers)
    for e in errors:
        fail(e)


def check_folders(src, layers):
    names = [n for n, _ in layers]
    for d in sorted(os.listdir(src)):
        p = os.path.join(src, d)
        if os.path.isdir(p) and any(f.endswith(".c") for f in os.listdir(p)) and d not in names:
            fail("src/%s has code but is no layer in src/meson.build clg_layers" % d)
    for n in names:
        if not os.path.isdir(os.path.join(src, n)):
            fail("layer '%s' of src/meson.build has no folder src/%s" % (n, n))


def doc_table(doc):
    """The rows of the table under "## Layers of the code": [(folder, [uses])]."""
    text = open(doc, encoding="utf-8").read()
    m = re.search(r"^## Layers of the code.*?\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    if not m:
        fail("%s has no section '## Layers of the code'" % doc)
        return []
    rows = []
    header = None
    for line in m.group(1).splitlines():
        if not line.startswith("|"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if header is None:
            header = [c.lower() for c in cells]
            continue
        if set(line.replace("|", "").strip()) <= set("-: "):
            continue
        folder = re.fullmatch(r"`src/([a-z_]+)/`", cells[0])
        if not folder:
            continue  # include/, cl/: not libraries
        if "uses" not in header:
            fail("the layer table of %s has no 'uses' column" % doc)
            return []
        uses = re.findall(r"`([a-z_]+)`", cells[header.index("uses")])
        rows.append((folder.group(1), uses))
    return rows


def check_doc(doc, layers):
    rows = doc_table(doc)
    want = [n for n, _ in layers]
    got = [n for n, _ in rows]
    if got != want:
        fail("%s lists the folders %s; the build (src/meson.build) has %s, bottom up" % (doc, got, want))
    built = dict(layers)
    for name, uses in rows:
        if name in built and sorted(uses) != sorted(built[name]):
            fail("%s: src/%s/ uses %s; the build says %s" % (doc, name, sorted(uses), sorted(built[name])))


def main(argv):
    if len(argv) < 4:
        print(__doc__, file=sys.stderr)
        return 2
    src, doc, checker = argv[0], argv[1], argv[2]
    rest, libs = argv[3:], []
    while len(rest) >= 2 and rest[0] == "--lib":
        libs.append(rest[1])
        rest = rest[2:]
    cl = load_checker(checker)
    layers = cl.parse_layers(rest)
    check_includes(cl, src, layers)
    check_libs(cl, libs, layers)
    check_folders(src, layers)
    check_doc(doc, layers)
    if failures:
        print("%d check(s) failed" % len(failures))
        return 1
    print("layers: " + "; ".join("%s uses %s" % (n, ", ".join(u) or "nothing") for n, u in layers))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
