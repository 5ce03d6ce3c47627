#!/bin/sh
# MPI data parallelism (issue #14) on one machine, with mpirun:
#  1. -np 2 and -np 3 (uneven slices), and 2 ranks x 2 devices: weights
#     after 20 steps equal one process x one device within 1e-5
#     (max |a-b| / (1 + max |a|); only the summation order differs: ~3e-8);
#  2. batch norm: 2 ranks x 1 device equal 1 process x 2 devices (even split:
#     the same slices, the same per-slice statistics) within 1e-5;
#  3. --deterministic twice (-np 3): bitwise-equal checkpoints; and a run
#     stopped after 10 steps and resumed by every rank from that checkpoint
#     equals the uninterrupted one bitwise; 2 ranks x 2 devices with
#     --shard-optimizer bitwise equal to the same without;
#  4. a rank stopped (SIGSTOP: hung) -> the job exits non-zero within
#     --comm-timeout (+ grace) with a message naming that rank; a rank killed
#     (SIGKILL) -> non-zero exit within the timeout; the previous checkpoint loads;
#  5. bench allreduce checks its sums (-np 3) and prints bus bandwidth.
# usage: mpi_test.sh PATH/TO/clgrad PYTHON MPI_BUILT(0|1)
clgrad="$1"; py="$2"; built="$3"
. "$(dirname "$0")/cli_common.sh"
mpi_setup mpi "$built" 120
export POCL_DEVICES=basic # one one-thread device per rank

# 1. ranks vs one process
"$clgrad" train "$tmp/mlp.cfg" $T --save "$tmp/w1.st" >"$tmp/o" 2>&1 || { cat "$tmp/o"; fail "1 process run"; }
for np in 2 3; do
    if mpi $np "$clgrad" train "$tmp/mlp.cfg" $T --save "$tmp/w$np.st" --trace "$tmp/tr$np.json" >"$tmp/o" 2>&1; then
        for r in $(seq 0 $((np - 1))); do # a trace per rank, each with its MPI row and the buckets' all-reduces
            f="$tmp/tr$np.json"; [ $r -gt 0 ] && f="$tmp/tr$np.rank$r.json"
            grep -q "\"MPI rank $r of $np\"" "$f" 2>/dev/null && grep -q '"all-reduce bucket 0 (' "$f" ||
                fail "-np $np: trace of rank $r ($f) lacks the MPI row or its all-reduce spans"
        done
        grep -q "MPI ranks $np x 1" "$tmp/o" || fail "-np $np: no 'MPI ranks $np x 1' line (rank 0 reports once)"
        [ "$(grep -c '^trained' "$tmp/o")" -eq 1 ] || fail "-np $np: the result was printed $(grep -c '^trained' "$tmp/o") times"
        cmp_w "$tmp/w1.st" "$tmp/w$np.st" 1e-5 || fail "-np $np weights differ from one process"
    else
        tail -5 "$tmp/o"; fail "-np $np run failed"
    fi
done

# eval: every rank its slices, sums printed once by rank 0 (an early, imperfect model)
"$clgrad" train "$tmp/mlp.cfg" --data "$tmp/data" --steps 1 --no-eval --quiet --lr 0.001 --save "$tmp/e.st" >/dev/null 2>&1 ||
    fail "1-step run for eval"
"$clgrad" eval "$tmp/mlp.cfg" --weights "$tmp/e.st" --data "$tmp/data" 2>/dev/null | head -3 >"$tmp/e1" || fail "eval"
mpi 3 "$clgrad" eval "$tmp/mlp.cfg" --weights "$tmp/e.st" --data "$tmp/data" 2>/dev/null >"$tmp/e3" || fail "eval -np 3"
[ "$(grep -c '^samples' "$tmp/e3")" -eq 1 ] || fail "eval -np 3 printed $(grep -c '^samples' "$tmp/e3") reports"
# samples and accuracy exact; loss (printed to 4 decimals) within 2e-4: only the summation order differs
awk 'NR == FNR { v[FNR] = $2; next } FNR <= 3 { d = $2 - v[FNR]; if (d < 0) d = -d;
     if ((FNR == 2 && d > 2e-4) || (FNR != 2 && $2 != v[FNR])) bad = 1 } END { exit bad }' "$tmp/e1" "$tmp/e3" ||
    { cat "$tmp/e1" "$tmp/e3"; fail "eval -np 3: samples/loss/accuracy differ from one process"; }

# ranks x lanes: 2 ranks x 2 devices (hierarchical: lanes on the host, then ranks)
POCL_DEVICES="basic basic" mpi 2 "$clgrad" train "$tmp/mlp.cfg" $T --split even --save "$tmp/w22.st" >"$tmp/o" 2>&1 ||
    { tail -5 "$tmp/o"; fail "2 ranks x 2 devices run"; }
grep -q "MPI ranks 2 x 2" "$tmp/o" || fail "2 ranks x 2 devices: no 'MPI ranks 2 x 2' line"
cmp_w "$tmp/w1.st" "$tmp/w22.st" 1e-5 || fail "2 ranks x 2 devices: weights differ from one process"

# 2. batch norm: ranks = lanes
POCL_DEVICES="basic basic" "$clgrad" train "$tmp/bn.cfg" $T --split even --save "$tmp/b1.st" >"$tmp/o" 2>&1 ||
    { tail -5 "$tmp/o"; fail "2-device batch-norm run"; }
mpi 2 "$clgrad" train "$tmp/bn.cfg" $T --save "$tmp/b2.st" >"$tmp/o" 2>&1 || { tail -5 "$tmp/o"; fail "-np 2 batch-norm run"; }
cmp_w "$tmp/b1.st" "$tmp/b2.st" 1e-5 || fail "batch norm: 2 ranks differ from 2 devices in one process"

# 3. deterministic: bitwise, twice; and resume
for k in a b; do
    mpi 3 "$clgrad" train "$tmp/bn.cfg" $T --deterministic --checkpoint "$tmp/d$k" >"$tmp/o" 2>&1 ||
        { tail -5 "$tmp/o"; fail "--deterministic run $k"; }
done
cmp_w "$tmp/da/last.safetensors" "$tmp/db/last.safetensors" 0 || fail "--deterministic: checkpoints differ"
mpi 3 "$clgrad" train "$tmp/bn.cfg" --data "$tmp/data" --epochs 100 --steps 10 --no-eval --quiet --deterministic \
    --checkpoint "$tmp/dr" >"$tmp/o" 2>&1 || { tail -5 "$tmp/o"; fail "--deterministic 10 steps"; }
mpi 3 "$clgrad" train "$tmp/bn.cfg" $T --deterministic --checkpoint "$tmp/dr" --resume >"$tmp/o" 2>&1 ||
    { tail -5 "$tmp/o"; fail "--deterministic resume"; }
cmp_w "$tmp/da/last.safetensors" "$tmp/dr/last.safetensors" 0 || fail "resumed run differs from the uninterrupted one"
# 3b. sharded optimizer state over each rank's 2 devices: bitwise the unsharded run
for k in zu zs; do
    (export POCL_DEVICES="basic basic"
     mpi 2 "$clgrad" train "$tmp/bn.cfg" $T --deterministic --split even --checkpoint "$tmp/$k" \
         $([ $k = zs ] && echo --shard-optimizer) >"$tmp/o" 2>&1) || { tail -5 "$tmp/o"; fail "2 x 2 devices run $k"; }
done
cmp_w "$tmp/zu/last.safetensors" "$tmp/zs/last.safetensors" 0 || fail "--shard-optimizer under mpirun differs"
"$py" - "$tmp/da/last.safetensors" <<'PYEOF' || fail "checkpoint metadata lacks ranks = 3"
import json, struct, sys
raw = open(sys.argv[1], "rb").read()
meta = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])["__metadata__"]
sys.exit(0 if meta.get("ranks") == "3" and meta.get("devices.count") == "1" else 1)
PYEOF

# 4. a hung rank, then a dead rank
for sig in STOP KILL; do
    rm -rf "$tmp/ck" "$tmp/pid"; mkdir -p "$tmp/pid"
    mpi 3 sh -c 'echo $$ > "$0/$OMPI_COMM_WORLD_RANK"; exec "$@"' "$tmp/pid" "$clgrad" train "$tmp/mlp.cfg" \
        --data "$tmp/data" --epochs 100000 --no-eval --quiet --checkpoint "$tmp/ck" --comm-timeout 4 >"$tmp/o" 2>&1 &
    job=$!; bg="$job"
    i=0; while [ ! -f "$tmp/ck/last.safetensors" ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
    [ -f "$tmp/ck/last.safetensors" ] || { fail "$sig: no checkpoint appeared"; continue; }
    sleep 0.3
    cp "$tmp/ck/last.safetensors" "$tmp/before.st"
    victim=$(cat "$tmp/pid/1"); bg="$job $victim"
    t0=$(date +%s)
    kill -$sig "$victim"
    wait $job; rc=$?; t1=$(date +%s)
    kill -9 "$victim" 2>/dev/null
    el=$((t1 - t0))
    echo "SIG$sig of rank 1: job exit $rc after ${el} s"
    [ "$rc" -ne 0 ] || fail "SIG$sig: the job exited 0"
    [ "$el" -le 12 ] || fail "SIG$sig: the job took ${el} s to end (timeout 4 s)"
    if [ $sig = STOP ]; then
        grep -q "rank 1 did not answer" "$tmp/o" || { tail -5 "$tmp/o"; fail "SIGSTOP: no message naming rank 1"; }
    else
        grep -q "rank 1" "$tmp/o" || { tail -5 "$tmp/o"; fail "SIGKILL: no message naming rank 1"; }
    fi
    "$clgrad" eval "$tmp/mlp.cfg" --weights "$tmp/ck/last.safetensors" --data "$tmp/data" >/dev/null 2>&1 ||
        fail "SIG$sig: the last checkpoint does not load"
    bg=""
done

# 5. bench allreduce: checks its own sums
mpi 3 "$clgrad" bench allreduce --max-mib 1 >"$tmp/o" 2>&1 || { tail -5 "$tmp/o"; fail "bench allreduce -np 3"; }
grep -q "^ *1048576 " "$tmp/o" || { cat "$tmp/o"; fail "bench allreduce: no 1 MiB row"; }
mpi 2 "$clgrad" bench allreduce --max-mib 1 --deterministic --json >"$tmp/o" 2>&1 ||
    { tail -5 "$tmp/o"; fail "bench allreduce --deterministic"; }
grep -q '"busbw_gbs"' "$tmp/o" || fail "bench allreduce --json: no busbw_gbs"
echo "mpi: $fails failure(s)"
[ "$fails" -eq 0 ]
