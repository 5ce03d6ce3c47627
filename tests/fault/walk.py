#!/usr/bin/env python3
"""Walks OpenCL fault injection over a short resumed training run (issue #11).

For each kind of OpenCL call (tests/fault/fault_shim.c) and each N (every call,
or a sample within a time budget), runs tests/fault/fault_run with call N of
that kind failing, under a timeout, and judges the run:
  clean     exit 0 (fault absorbed) or 1 (failed with a status and message),
            nothing else below
  defects   hang (timeout), crash (signal), sanitizer report (ASan/UBSan/LSan),
            OpenCL objects leaked (4), checkpoint unloadable (3), temporary
            checkpoint file left (5), no status message, other exit codes
Every run resumes the same epoch-1 checkpoint (restored before each run) with
the same program cache (a hard-linked copy), so call N is the same call each
time. Prints one line per kind and the totals; exit 0 when every run ended
cleanly, 1 otherwise, 2 when the setup failed.

usage: walk.py --run build/tests/fault/fault_run --model models/lenet5.cfg
               [--devices 0] [--kinds buffer,launch] [--every K | --budget S]
               [--timeout S] [--log FILE.jsonl] [--cold]
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

DEFECT = {3: "checkpoint unloadable", 4: "OpenCL objects leaked", 5: "temporary file left"}


def run(args, work, fault=None, report=None, timeout=60):
    env = dict(os.environ)
    env["CLGRAD_CACHE_DIR"] = os.path.join(work, "cache-run")
    env.pop("CLG_FAULT", None)
    if fault:
        env["CLG_FAULT"] = fault
    if report:
        env["CLG_FAULT_REPORT"] = report
    t0 = time.time()
    try:
        p = subprocess.run([args.run, "run", work, args.model, args.devices], env=env, capture_output=True,
                           text=True, errors="replace", timeout=timeout)
        return p.returncode, p.stdout, p.stderr, time.time() - t0
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        return None, out, err, time.time() - t0


COLD = False  # --cold: no program binaries in the run's cache: every program is built from source


def restore(work):
    ck = os.path.join(work, "ck")
    shutil.rmtree(ck, ignore_errors=True)
    shutil.copytree(os.path.join(work, "ck0"), ck)
    cache = os.path.join(work, "cache-run")
    shutil.rmtree(cache, ignore_errors=True)
    os.mkdir(cache)
    src = os.path.join(work, "cache")
    for f in os.listdir(src):
        if not (COLD and f.endswith(".clbin")):
            os.link(os.path.join(src, f), os.path.join(cache, f))


def read_report(path, foreign=None):
    """calls per kind, clgrad's live objects per type, fired; foreign (a dict) receives the live
    objects clFFT / CLBlast created (their own leaks, reported apart)."""
    calls, live, fired = {}, {}, 0
    with open(path) as f:
        for line in f:
            w = line.split()
            if w[0] == "calls":
                calls[w[1]] = int(w[2])
            elif w[0] == "live":
                live[w[1]] = int(w[2])
            elif w[0] == "foreign" and foreign is not None:
                foreign[w[1]] = int(w[2])
            elif w[0] == "fired":
                fired = int(w[1])
    return calls, live, fired


def judge(rc, out, err):
    """(verdict, detail): verdict 'absorbed' / 'failed' are clean."""
    if re.search(r"(Address|Leak|UndefinedBehavior|Thread)Sanitizer|runtime error:", err):
        m = re.search(r"((Address|Leak|UndefinedBehavior|Thread)Sanitizer[^\n]*|runtime error:[^\n]*)", err)
        return "sanitizer", m.group(1) if m else ""
    if rc is None:
        return "hang", "timeout"
    if rc < 0:
        return "crash", "signal %d" % -rc
    if rc in DEFECT:
        return DEFECT[rc], (err.strip().splitlines() or [""])[-1]
    if rc == 0 and "fault_run: run: ok" in out:
        return "absorbed", ""
    m = re.search(r"fault_run: run failed: (\S+) \([^)]*\): (.+)", out)
    if rc == 1 and m and m.group(2).strip():
        return "failed", m.group(1) + ": " + m.group(2).strip()
    return "unexpected", "exit %s: %s" % (rc, (out + err).strip()[-300:])


def plan(counts, kinds, every, budget, t_run):
    """{kind: [N...]} -- every call, every k-th, or as many as fit the budget."""
    kinds = [k for k in kinds if counts.get(k, 0) > 0]
    if budget is None:
        return {k: list(range(1, counts[k] + 1, every)) for k in kinds}
    total = max(len(kinds), int(budget / max(t_run, 0.05)))
    quota, left, todo = {}, total, sorted(kinds, key=lambda k: counts[k])
    for i, k in enumerate(todo):  # small kinds whole, the rest share what is left
        quota[k] = min(counts[k], max(1, left // (len(todo) - i)))
        left -= quota[k]
    out = {}
    for k in kinds:
        c, q = counts[k], quota[k]
        out[k] = sorted({1 + round(i * (c - 1) / (q - 1)) for i in range(q)}) if q > 1 else [1 + (c - 1) // 2]
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--devices", default="0")
    ap.add_argument("--kinds", default="")
    ap.add_argument("--every", type=int, default=1)
    ap.add_argument("--budget", type=float, default=None, help="seconds: sample within this time")
    ap.add_argument("--timeout", type=float, default=60)
    ap.add_argument("--log", default="")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--cold", action="store_true", help="build every program from source in each run")
    a = ap.parse_args()
    global COLD
    COLD = a.cold
    work = tempfile.mkdtemp(prefix="clgrad-fault-")
    logf = open(a.log, "w") if a.log else None
    try:
        env = dict(os.environ, CLGRAD_CACHE_DIR=os.path.join(work, "cache"))
        env.pop("CLG_FAULT", None)
        os.mkdir(os.path.join(work, "cache"))
        seed = os.environ.get("CLGRAD_CACHE_DIR", "")  # start from the caller's program cache (hard links:
        if seed and os.path.isdir(seed):               # entries are replaced by rename, never rewritten)
            for f in os.listdir(seed):
                src = os.path.join(seed, f)
                if os.path.isfile(src):
                    try:
                        os.link(src, os.path.join(work, "cache", f))
                    except OSError:
                        shutil.copy2(src, os.path.join(work, "cache", f))
        p = subprocess.run([a.run, "prepare", work, a.model, a.devices], env=env, capture_output=True, text=True,
                           timeout=600)
        if p.returncode != 0:
            print("walk: prepare failed:", p.stdout, p.stderr, file=sys.stderr)
            return 2
        shutil.copytree(os.path.join(work, "ck"), os.path.join(work, "ck0"))
        restore(work)
        rep = os.path.join(work, "report.txt")
        rc, out, err, t_run = run(a, work, None, rep, a.timeout)
        if rc != 0:
            print("walk: the run without a fault failed (exit %s):" % rc, out, err, file=sys.stderr)
            return 2
        counts, live, _ = read_report(rep)
        restore(work)
        rc, out, err, t_run = run(a, work, None, rep, a.timeout)  # warm: the time of a run
        counts2, _, _ = read_report(rep)
        for k in counts:  # waits on events that may be complete already vary: a fault there may not be reached
            if counts2.get(k, 0) != counts[k]:
                print("walk: calls of kind %s vary between runs (%d, %d)" % (k, counts[k], counts2.get(k, 0)))
                counts[k] = max(counts[k], counts2.get(k, 0))
        kinds = [k for k in a.kinds.split(",") if k] or list(counts)
        todo = plan(counts, kinds, a.every, a.budget, t_run)
        print("walk: calls per kind in one run (devices %s): %s" % (
            a.devices, ", ".join("%s %d" % (k, counts[k]) for k in counts if counts[k])))
        print("walk: %d runs planned, about %.2f s each" % (sum(len(v) for v in todo.values()), t_run))
        sys.stdout.flush()
        tried = clean = named = retried = dep_leaks = 0
        bad = []
        t0 = time.time()
        for k, ns in todo.items():
            res = {}
            for n in ns:
                restore(work)
                rc, out, err, dt = run(a, work, "%s:%d" % (k, n), rep, a.timeout)
                fired, live, foreign = 0, {}, {}
                try:
                    _, live, fired = read_report(rep, foreign)
                except (OSError, IndexError, ValueError):
                    fired = 1 if "fault-shim:" in err else 0
                v, detail = judge(rc, out, err)
                if v == DEFECT[4]:
                    detail = "alive: " + ", ".join("%s %d" % (t, c) for t, c in live.items() if c) + \
                             "; " + ((re.findall(r"fault_run: run failed: [^\n]*", out) or [""])[0])
                if "LeakSanitizer has encountered a fatal error" in err:  # the tool's own failure (its tracer
                    restore(work)                                          # under load): once more
                    rc, out, err, dt = run(a, work, "%s:%d" % (k, n), rep, a.timeout)
                    v, detail = judge(rc, out, err)
                    retried += 1
                if not fired and v in ("absorbed", "failed"):
                    v = "not reached"
                where = re.search(r"fault-shim: (\S+)", err)
                foreign = {t: c for t, c in foreign.items() if c}
                if foreign and fired:
                    dep_leaks += 1
                if logf:
                    logf.write(json.dumps({"kind": k, "n": n, "verdict": v, "exit": rc, "seconds": round(dt, 2),
                                           "call": where.group(1) if where else "", "detail": detail,
                                           "foreign_alive": foreign}) + "\n")
                    logf.flush()
                res[v] = res.get(v, 0) + 1
                if v == "not reached":
                    continue
                tried += 1
                if v in ("absorbed", "failed"):
                    clean += 1
                    named += v == "failed" and re.search(r"CL_[A-Z_]+", detail) is not None
                else:
                    bad.append("%s:%d (%s): %s %s" % (k, n, where.group(1) if where else "?", v, detail))
            print("  %-8s %5d calls, %4d tried: %s" % (k, counts[k], len(ns),
                                                      ", ".join("%s %d" % (v, c) for v, c in sorted(res.items()))))
            sys.stdout.flush()
        print("walk: faults tried %d, ended cleanly %d (failed with a message naming the OpenCL error: %d), "
              "defects %d, %.0f s" % (tried, clean, named, len(bad), time.time() - t0))
        if dep_leaks:
            print("walk: %d runs left OpenCL objects that clFFT or CLBlast created alive (their leak, not "
                  "clgrad's; --log lists them)" % dep_leaks)
        if retried:
            print("walk: %d runs repeated after a LeakSanitizer tool error" % retried)
        for b in bad[:50]:
            print("  DEFECT", b)
        return 0 if not bad and tried > 0 else 1
    finally:
        if logf:
            logf.close()
        if a.keep:
            print("walk: kept", work)
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
