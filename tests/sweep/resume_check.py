"""Checks a killed-and-resumed sweep against an uninterrupted one (tests/sweep/*.sh).

usage: python3 resume_check.py FULL.csv BEFORE.csv AFTER.csv
  FULL    results.csv of the uninterrupted sweep (6 + 3 ASHA jobs)
  BEFORE  the killed sweep's results.csv, copied at the kill
  AFTER   the same sweep's results.csv after --resume
Fails (exit 1, one line per problem) when the kill came after the end, a job
finished before the kill changed, a job ran twice, or the resumed results
(state, metrics, parameters) differ from the uninterrupted ones.
"""
import csv
import sys

full, before, after = (list(csv.DictReader(open(p))) for p in sys.argv[1:4])
bad = []
key = lambda r: (int(r["trial"]), int(r["rung"]))
if len(full) != 9:
    bad.append(f"uninterrupted: {len(full)} jobs, expected 6 + 3")
if len(before) >= len(full):
    bad.append(f"the kill came after the end ({len(before)} jobs)")
for b, a in zip(before, after):
    if a != b:
        bad.append(f"a finished job changed on resume:\n    {b}\n    {a}")
keys = [key(r) for r in after]
if len(set(keys)) != len(keys):
    bad.append(f"a job ran twice: {sorted(keys)}")
fields = ("state", "val_loss", "val_acc", "lr", "momentum")
fm = {key(r): tuple(r[f] for f in fields) for r in full}
am = {key(r): tuple(r[f] for f in fields) for r in after}
if fm != am:
    bad.append(f"results differ from the uninterrupted sweep:\n    {sorted(fm.items())}\n    {sorted(am.items())}")
for b in bad:
    print("  " + b)
sys.exit(1 if bad else 0)
