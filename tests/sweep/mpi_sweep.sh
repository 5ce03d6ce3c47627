#!/bin/sh
# clgrad sweep under mpirun -np 2 on one machine (issue #25), LeNet-5 on a
# few hundred fresh random 28x28 images, two PoCL devices (the two ranks
# share them out: one each):
#  1. a grid (one trial diverges, one trial's process is killed once on the
#     rank that runs it): both ranks ran trials, the table is complete,
#     every trial ran once, the killed one was retried and the diverging one
#     marked failed, and every result equals the one-process sweep's;
#  2. a synchronous ASHA sweep under mpirun whose rank 0 is killed (SIGKILL)
#     mid-run, resumed under mpirun: no trial process left behind, finished
#     jobs kept byte for byte, none run twice, and the results of the same
#     sweep run in one process without interruption.
# usage: mpi_sweep.sh PATH/TO/clgrad PYTHON MPI_BUILT(0|1)
clgrad="$1"; py="$2"; built="$3"
[ "$built" = 1 ] || { echo "skip: clgrad built without MPI (meson feature 'mpi' off or Open MPI not found)"; exit 77; }
command -v mpirun >/dev/null 2>&1 || { echo "skip: no mpirun on PATH (Debian: openmpi-bin)"; exit 77; }
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d /tmp/clgrad-msweep-XXXXXX) || exit 1
bg=""
trap 'for p in $bg; do kill -9 $p 2>/dev/null; done; rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export POCL_DEVICES="${POCL_DEVICES:-pthread pthread}"
ndev=$("$clgrad" devices --json 2>/dev/null | "$py" -c 'import json,sys; print(len(json.load(sys.stdin)))' 2>/dev/null)
if [ "${ndev:-0}" -lt 2 ]; then echo "skip: needs 2 OpenCL devices (POCL_DEVICES=\"pthread pthread\"), found ${ndev:-0}"; exit 77; fi
fails=0; n=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
mpi() { timeout 240 mpirun -np 2 --oversubscribe --bind-to none -x POCL_DEVICES -x CLGRAD_CACHE_DIR \
    -x CLGRAD_BACKGROUND_TUNE "$@"; }
"$py" "$here/../train/make_idx.py" "$tmp/data" 28 480 32 --quadrants || { echo "cannot write the dataset"; exit 1; }
common="--data $tmp/data --limit-train 320 --val-fraction 0.25 --devices 0,1"
# the results of two sweeps' tables, without times and places, must agree
same="$tmp/same.py"
cat >"$same" <<'PYEOF'
import csv, sys
a, b = (list(csv.DictReader(open(p))) for p in sys.argv[1:3])
drop = ("start", "end", "seconds", "devices", "note")
key = lambda r: (int(r["trial"]), int(r["rung"]))
ma = {key(r): {k: v for k, v in r.items() if k not in drop} for r in a}
mb = {key(r): {k: v for k, v in r.items() if k not in drop} for r in b}
bad = [f"{k}: {ma.get(k)} != {mb.get(k)}" for k in sorted(set(ma) | set(mb)) if ma.get(k) != mb.get(k)]
for x in bad: print("  " + x)
sys.exit(1 if bad else 0)
PYEOF

# ---- 1. a grid over two ranks against one process ----
grid="$common --param lr=0.005,0.02,100 --param momentum=0.5,0.9"
n=$((n + 1))
"$clgrad" sweep lenet5 $grid --dir "$tmp/g1" >/dev/null 2>"$tmp/g1.err" || { fail "one-process grid: exit $?"; tail -5 "$tmp/g1.err"; }
n=$((n + 1))
mpi "$clgrad" sweep lenet5 $grid --dir "$tmp/g2" --json >"$tmp/g2.json" 2>"$tmp/g2.err" &
pid=$!; bg="$pid"
# trial 1 (the second job: rank 1's first) has its process killed once: retried, not failed
i=0; child=""
while [ $i -lt 600 ] && [ -z "$child" ]; do
    child=$(ps -eo pid=,args= 2>/dev/null | grep "[t]rain $tmp/g2/trial-0001/model.cfg" | awk '{print $1}')
    [ -z "$child" ] && sleep 0.05; i=$((i + 1))
done
[ -n "$child" ] && kill -9 $child || fail "trial 1's process not seen"
wait $pid || { fail "grid under mpirun: exit $?"; tail -5 "$tmp/g2.err"; }
grep -q "under mpirun: rank 0 hands out the jobs" "$tmp/g2.err" || fail "the sweep did not say it spread over ranks"
grep -q "trial    1 rung 0: the process was killed by signal 9; retrying once" "$tmp/g2.err" || fail "no retry said"
"$py" - "$tmp/g2" "$tmp/g2.json" <<'PYEOF' || fail "grid under mpirun (above)"
import csv, json, sys
d, js = sys.argv[1], sys.argv[2]
rows = list(csv.DictReader(open(f"{d}/results.csv")))
bad = []
trials = sorted(int(r["trial"]) for r in rows)
if trials != list(range(6)): bad.append(f"trials {trials}: not each of 0-5 once")
ranks = {r["devices"].split(":")[0] for r in rows}
if ranks != {"r0", "r1"}: bad.append(f"ranks that ran trials: {sorted(ranks)} (devices {[r['devices'] for r in rows]})")
for r in rows:
    failed = r["lr"] == "100"
    if (r["state"] == "failed") != failed or (failed and "diverged" not in r["note"]):
        bad.append(f"trial {r['trial']} (lr {r['lr']}): state {r['state']}, note {r['note']}")
if "retried once" not in next((r["note"] for r in rows if r["trial"] == "1"), ""): bad.append("trial 1 not marked retried")
j = json.load(open(js))
if len(j["trials"]) != 6: bad.append(f"--json: {len(j['trials'])} trials")
for b in bad: print("  " + b)
sys.exit(1 if bad else 0)
PYEOF
"$py" "$same" "$tmp/g1/results.csv" "$tmp/g2/results.csv" || fail "the grid under mpirun differs from the one-process grid (above)"

# ---- 2. ASHA under mpirun: rank 0 killed, resumed under mpirun ----
asha="$common --method asha --promotion sync --trials 6 --reduction 2 --min-epochs 1 --max-epochs 2 --seed $$
      --param lr=log:0.002:0.05 --param momentum=0.5,0.9"
n=$((n + 1))
"$clgrad" sweep lenet5 $asha --dir "$tmp/a1" >/dev/null 2>"$tmp/a1.err" || { fail "one-process asha: exit $?"; tail -5 "$tmp/a1.err"; }
mpi "$clgrad" sweep lenet5 $asha --dir "$tmp/a2" >/dev/null 2>"$tmp/a2.err" &
pid=$!; bg="$pid"
i=0
while [ $i -lt 1200 ] && [ "$(cat "$tmp/a2/results.csv" 2>/dev/null | wc -l)" -lt 4 ]; do sleep 0.05; i=$((i + 1)); done
rank0=""
for p in $(pgrep -f "sweep lenet5 .*--dir $tmp/a2"); do
    tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=0" && rank0=$p
done
[ -n "$rank0" ] && kill -9 "$rank0" || fail "rank 0 of the ASHA sweep not found"
wait $pid 2>/dev/null
cp "$tmp/a2/results.csv" "$tmp/a2.before.csv" 2>/dev/null || fail "the killed sweep left no results.csv"
sleep 0.5 # the trials die with their ranks
n=$((n + 1))
left=$(ps -eo args= | grep -c "[t]rain $tmp/a2/")
[ "$left" -eq 0 ] || fail "$left trial process(es) outlived the killed sweep"
n=$((n + 1))
mpi "$clgrad" sweep --dir "$tmp/a2" --resume >/dev/null 2>"$tmp/a2r.err" || { fail "resume under mpirun: exit $?"; tail -5 "$tmp/a2r.err"; }
grep -q "resuming" "$tmp/a2r.err" || fail "resume did not say so"
"$py" "$(dirname "$0")/resume_check.py" "$tmp/a1/results.csv" "$tmp/a2.before.csv" "$tmp/a2/results.csv" ||
    fail "kill + resume under mpirun (above)"
"$py" "$same" "$tmp/a1/results.csv" "$tmp/a2/results.csv" || fail "the resumed ASHA sweep differs from the uninterrupted one (above)"

echo "$((n - fails))/$n checks passed"
[ $fails -eq 0 ]
