#!/bin/sh
# clgrad sweep on two PoCL devices with LeNet-5 on a few hundred fresh
# random 28x28 images (issue #25): bad search specs are usage errors naming
# the parameter; a grid's trials run two at a time (their spans overlap on
# different devices) and its lr=100 trial is marked failed with its step;
# best.cfg, --json and the SVG; an ASHA sweep killed (SIGKILL) mid-run and
# resumed keeps every finished job as it was, reruns none, and ends with
# the results of the same sweep run without interruption.
# usage: cli_sweep.sh PATH/TO/clgrad PYTHON
clgrad="$1"; py="$2"
tmp=$(mktemp -d /tmp/clgrad-sweep-XXXXXX) || exit 1
trap 'rm -rf "$tmp"' EXIT
fails=0; n=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
ndev=$("$clgrad" devices --json 2>/dev/null | "$py" -c 'import json,sys; print(len(json.load(sys.stdin)))' 2>/dev/null)
if [ "${ndev:-0}" -lt 2 ]; then echo "skip: needs 2 OpenCL devices (POCL_DEVICES=\"pthread pthread\"), found ${ndev:-0}"; exit 77; fi

# 4 classes: a faint bright quadrant in strong noise, so the metrics differ between trials
"$py" - "$tmp/data" <<'PYEOF' || { echo "cannot write the dataset"; exit 1; }
import os, random, struct, sys
d = sys.argv[1]; os.makedirs(d)
rng = random.Random()
for split, n in (("train", 480), ("t10k", 32)):
    imgs, labs = bytearray(), bytearray()
    for i in range(n):
        k = rng.randrange(4); labs.append(k)
        for p in range(784):
            q = (p // 28 >= 14) * 2 + (p % 28 >= 14)
            imgs.append(min(255, rng.randrange(200) + (40 if q == k else 0)))
    open(f"{d}/{split}-images-idx3-ubyte", "wb").write(struct.pack(">IIII", 0x803, n, 28, 28) + imgs)
    open(f"{d}/{split}-labels-idx1-ubyte", "wb").write(struct.pack(">II", 0x801, n) + labs)
PYEOF
data="$tmp/data"

# ---- bad specs: exit 2, the parameter named ----
usage() { # usage PATTERN -- args...
    pat=$1; shift 2
    n=$((n + 1))
    out=$("$clgrad" sweep lenet5 --data "$data" --dir "$tmp/bad" "$@" 2>&1); rc=$?
    [ "$rc" -eq 2 ] && printf '%s\n' "$out" | grep -q -- "$pat" ||
        { fail "sweep $*: exit $rc (expected 2), output lacks \"$pat\":"; printf '%s\n' "$out" | head -3; }
}
usage "parameter 'lr'.*0 < LO" -- --param lr=log:0:1
usage "parameter 'colour': unknown key" -- --param colour=1,2
usage "parameter 'batch': empty list" -- --param batch=
usage "parameter 'batch': empty value" -- --param lr=0.1 --param batch=64,,128
usage "parameter 'nolayer.p': the model has no layer" -- --param nolayer.p=0.1,0.2
usage "(conv1.bogus=1) is refused.*unknown key 'bogus'" -- --param conv1.bogus=1,2
usage "nothing to search" --
usage "option --method wants one of grid, random, asha" -- --param lr=0.1 --method halving
printf '# the space\nlr=0.1,0.2\nbatch=64,\n' >"$tmp/space"
usage "space:3: parameter 'batch': empty value" -- --space "$tmp/space"
usage "devices-per-trial $((ndev + 1)): only $ndev device" -- --param lr=0.1 --devices-per-trial $((ndev + 1))
[ -e "$tmp/bad/results.csv" ] && fail "a refused sweep wrote results"
n=$((n + 1))
"$clgrad" sweep lenet5 --data "$data" --param lr=0.1 >/dev/null 2>&1; [ $? -eq 2 ] || fail "no --dir: not a usage error"

# ---- a grid on two devices: overlap, a diverging trial, outputs ----
common="--data $data --limit-train 320 --val-fraction 0.25"
# trial 0's process is killed once (SIGKILL) as soon as it runs: retried, not failed
n=$((n + 1))
"$clgrad" sweep lenet5 $common --dir "$tmp/grid" --param lr=0.005,0.02,100 --param momentum=0.9 --json \
    >"$tmp/grid.json" 2>"$tmp/grid.err" &
pid=$!
i=0; child=""
while [ $i -lt 300 ] && [ -z "$child" ]; do
    child=$(ps -o pid=,args= --ppid $pid 2>/dev/null | grep trial-0000 | awk '{print $1}')
    [ -z "$child" ] && sleep 0.05; i=$((i + 1))
done
[ -n "$child" ] && kill -9 $child || fail "trial 0's process not seen"
wait $pid || { fail "grid sweep: exit $?"; tail -5 "$tmp/grid.err"; }
grep -q "trial    0 rung 0: the process was killed by signal 9; retrying once" "$tmp/grid.err" || fail "no retry said"
"$py" - "$tmp/grid" "$tmp/grid.json" <<'PYEOF' || fail "grid sweep results (above)"
import csv, json, sys, xml.etree.ElementTree as ET
d, js = sys.argv[1], sys.argv[2]
rows = list(csv.DictReader(open(f"{d}/results.csv")))
bad = []
if sorted(int(r["trial"]) for r in rows) != [0, 1, 2]: bad.append(f"trials {[r['trial'] for r in rows]}")
by_lr = {r["lr"]: r for r in rows}
f = by_lr.get("100")
if not f or f["state"] != "failed" or "diverged" not in f["note"] or ("at step" in f["note"]) != (int(f["step"]) >= 1):
    bad.append(f"lr=100 not failed with its step: {f}")
ok = [r for r in rows if r["state"] == "ok"]
if "retried once" not in by_lr.get("0.005", {}).get("note", ""): bad.append(f"trial 0 not marked retried: {by_lr.get('0.005')}")
if len(ok) != 2: bad.append(f"{len(ok)} trials ok, expected 2")
spans = [(float(r["start"]), float(r["end"]), r["devices"]) for r in rows]
if not any(a[0] < b[1] and b[0] < a[1] and a[2] != b[2] for i, a in enumerate(spans) for b in spans[i + 1:]):
    bad.append(f"no two trials overlapped in time on different devices: {spans}")
j = json.load(open(js))
best = j["trials"][0]
if len(j["trials"]) != 3 or best["state"] != "done" or best["metric"] != max(float(r["val_acc"]) for r in ok):
    bad.append(f"--json ranking: {j['trials']}")
if j["trials"][-1]["params"]["lr"] != "100" or j["trials"][-1]["state"] != "failed": bad.append("failed trial not last")
cfg = open(f"{d}/best.cfg").read()
if f"learning_rate = {best['params']['lr']}" not in cfg or "momentum = 0.9" not in cfg: bad.append("best.cfg lacks the best's values")
ET.parse(f"{d}/sweep.svg")
for b in bad: print("  " + b)
sys.exit(1 if bad else 0)
PYEOF
n=$((n + 1))
"$clgrad" train "$tmp/grid/best.cfg" --data "$data" --epochs 1 --limit-train 64 --no-eval --quiet >/dev/null 2>&1 ||
    fail "best.cfg does not train"

# ---- ASHA (synchronous): uninterrupted, and killed + resumed ----
printf 'momentum=0.5,0.9  # from a file: saved for --resume like --param\n' >"$tmp/asha.space"
asha="$common --method asha --promotion sync --trials 6 --reduction 2 --min-epochs 1 --max-epochs 2 --seed $$
      --param lr=log:0.002:0.05 --space $tmp/asha.space"
n=$((n + 1))
"$clgrad" sweep lenet5 $asha --dir "$tmp/a1" >/dev/null 2>"$tmp/a1.err" || { fail "asha sweep: exit $?"; tail -5 "$tmp/a1.err"; }
"$clgrad" sweep lenet5 $asha --dir "$tmp/a2" >/dev/null 2>"$tmp/a2.err" &
pid=$!
i=0
while [ $i -lt 600 ] && [ "$(cat "$tmp/a2/results.csv" 2>/dev/null | wc -l)" -lt 4 ]; do sleep 0.1; i=$((i + 1)); done
kill -9 $pid 2>/dev/null; wait $pid 2>/dev/null
cp "$tmp/a2/results.csv" "$tmp/a2.before.csv" 2>/dev/null || fail "killed sweep left no results.csv"
sleep 0.3 # the trials die with the sweep
n=$((n + 1))
"$clgrad" sweep --dir "$tmp/a2" --resume >/dev/null 2>"$tmp/a2r.err" || { fail "resume: exit $?"; tail -5 "$tmp/a2r.err"; }
grep -q "resuming" "$tmp/a2r.err" || fail "resume did not say so"
"$py" "$(dirname "$0")/resume_check.py" "$tmp/a1/results.csv" "$tmp/a2.before.csv" "$tmp/a2/results.csv" ||
    fail "kill + resume (above)"
n=$((n + 1))
"$clgrad" sweep --dir "$tmp/a2" --resume --param lr=0.1 >/dev/null 2>&1; [ $? -eq 2 ] || fail "--resume with --param: not a usage error"
n=$((n + 1))
"$clgrad" sweep lenet5 $asha --dir "$tmp/a2" >/dev/null 2>&1; [ $? -eq 2 ] || fail "a second sweep into a sweep's --dir: not a usage error"

echo "$((n - fails))/$n checks passed"
[ $fails -eq 0 ]
