#!/bin/sh
# MPI ranks as the outer data-parallel level of pipeline and tensor-parallel
# layouts (issue #22, hybrid layouts): every rank runs the layout on its own
# devices over its slice of the global batch, each stage's / slice's gradients
# summed over the ranks before the update.
#  1. 2 ranks x pp=2, x tp=2 (2 PoCL devices per rank), x dp=2,pp=2 and
#     x dp=2,tp=2 (4 per rank): weights after 20 steps equal one process x one
#     device (same global batch; the pipeline accumulating micro-batches) within
#     1e-5 (max |a-b| / (1 + max |a|); dropout inside the split pair, so the
#     masks must follow the global sample index); 3 ranks x pp=2 with uneven
#     slices (batch 25);
#  2. batch norm: 2 ranks x pp=2 equal 1 process x dp=2,pp=2 (the same slices:
#     running statistics averaged over the ranks as over the replicas);
#  3. a checkpoint of 2 ranks x pp=2 (rank 0, one-device format) resumed on
#     one device, and on 2 ranks x tp=2, ends where the uninterrupted
#     one-device run ends;
#  eval over 2 ranks x pp=2 / tp=2 and one process x tp=2 reports what one
#     device does;
#  4. refused clearly: tp over ranks with batch norm;
#  5. a stopped rank (SIGSTOP) under pp=2: the job ends non-zero within the
#     --comm-timeout, naming the rank and the stage.
# usage: mpi_hybrid.sh PATH/TO/clgrad PYTHON MPI_BUILT(0|1)
clgrad="$1"; py="$2"; built="$3"
. "$(dirname "$0")/cli_common.sh"
mpi_setup mpihy "$built" 150 0.25
D2="basic basic"; D4="basic basic basic basic"

# 1. ranks x layout vs one process x one device
POCL_DEVICES=basic "$clgrad" train "$tmp/mlp.cfg" $T --save "$tmp/w1.st" >"$tmp/o" 2>&1 || { cat "$tmp/o"; fail "1 device run"; }
for lay in pp=2 tp=2 dp=2,pp=2 dp=2,tp=2; do
    case $lay in dp=*) devs=$D4; nd=4 ;; *) devs=$D2; nd=2 ;; esac
    if POCL_DEVICES="$devs" mpi 2 "$clgrad" train "$tmp/mlp.cfg" $T --devices all --parallel $lay \
        --save "$tmp/w-$lay.st" >"$tmp/o" 2>&1; then
        grep -q "MPI ranks 2 x $nd" "$tmp/o" || fail "2 ranks x $lay: no 'MPI ranks 2 x $nd' line"
        [ "$(grep -c '^trained' "$tmp/o")" -eq 1 ] || fail "2 ranks x $lay: the result was not printed once"
        echo "2 ranks x $lay:"
        cmp_w "$tmp/w1.st" "$tmp/w-$lay.st" 1e-5 || fail "2 ranks x $lay: weights differ from one device"
    else
        tail -5 "$tmp/o"; fail "2 ranks x $lay run"
    fi
done
# uneven slices (25 over 3 ranks: 9, 8, 8) x pp=2
POCL_DEVICES=basic "$clgrad" train "$tmp/mlp.cfg" $T --batch 25 --save "$tmp/u1.st" >"$tmp/o" 2>&1 || fail "batch 25 run"
POCL_DEVICES="$D2" mpi 3 "$clgrad" train "$tmp/mlp.cfg" $T --batch 25 --devices all --parallel pp=2 --save "$tmp/u3.st" \
    >"$tmp/o" 2>&1 || { tail -5 "$tmp/o"; fail "3 ranks x pp=2 run"; }
echo "3 ranks x pp=2, batch 25:"
cmp_w "$tmp/u1.st" "$tmp/u3.st" 1e-5 || fail "3 ranks x pp=2 (uneven slices): weights differ from one device"
# the same global batch over one process x pp=2: the ranks' reduction is what makes them equal (not vacuous)
POCL_DEVICES="$D2" "$clgrad" train "$tmp/mlp.cfg" $T --batch 12 --devices all --parallel pp=2 --save "$tmp/wh.st" \
    >"$tmp/o" 2>&1 || { tail -5 "$tmp/o"; fail "half-batch run"; }
cmp_w "$tmp/w1.st" "$tmp/wh.st" 1e-3 >/dev/null && fail "a half batch lands within 1e-3 of the full one: vacuous check"

# 2. batch norm: 2 ranks x pp=2 = 1 process x dp=2,pp=2
POCL_DEVICES="$D4" "$clgrad" train "$tmp/bn.cfg" $T --devices all --parallel dp=2,pp=2 --save "$tmp/b1.st" \
    >"$tmp/o" 2>&1 || { tail -5 "$tmp/o"; fail "dp=2,pp=2 batch-norm run"; }
POCL_DEVICES="$D2" mpi 2 "$clgrad" train "$tmp/bn.cfg" $T --devices all --parallel pp=2 --save "$tmp/b2.st" \
    >"$tmp/o" 2>&1 || { tail -5 "$tmp/o"; fail "2 ranks x pp=2 batch-norm run"; }
echo "batch norm, 2 ranks x pp=2 vs dp=2,pp=2:"
cmp_w "$tmp/b1.st" "$tmp/b2.st" 1e-5 || fail "batch norm: 2 ranks x pp=2 differ from dp=2,pp=2 in one process"

# 3. a 2 ranks x pp=2 checkpoint resumed on one device
POCL_DEVICES="$D2" mpi 2 "$clgrad" train "$tmp/mlp.cfg" --data "$tmp/data" --epochs 100 --steps 10 --no-eval --quiet \
    --devices all --parallel pp=2 --checkpoint "$tmp/ck" >"$tmp/o" 2>&1 || { tail -5 "$tmp/o"; fail "checkpointed run"; }
POCL_DEVICES=basic "$clgrad" train "$tmp/mlp.cfg" $T --checkpoint "$tmp/ck" --resume --save "$tmp/wr.st" >"$tmp/o" 2>&1 ||
    { tail -5 "$tmp/o"; fail "resume on one device"; }
echo "2 ranks x pp=2, 10 steps, resumed on one device:"
cmp_w "$tmp/w1.st" "$tmp/wr.st" 1e-5 || fail "resumed on one device: differs from the one-device run"
POCL_DEVICES="$D2" mpi 2 "$clgrad" train "$tmp/mlp.cfg" $T --devices all --parallel tp=2 --checkpoint "$tmp/ck" \
    --resume --save "$tmp/wr2.st" >"$tmp/o" 2>&1 || { tail -5 "$tmp/o"; fail "resume on 2 ranks x tp=2"; }
echo "2 ranks x pp=2, 10 steps, resumed on 2 ranks x tp=2:"
cmp_w "$tmp/w1.st" "$tmp/wr2.st" 1e-5 || fail "resumed on 2 ranks x tp=2: differs from the one-device run"

# eval: every rank its slices through its layout, rank 0 prints the sums once; and one process x tp=2 (whose
# evaluation once ran the stub lane). Samples and accuracy exact, loss within 2e-4 (4 decimals printed)
POCL_DEVICES=basic "$clgrad" train "$tmp/mlp.cfg" --data "$tmp/data" --steps 1 --no-eval --quiet --lr 0.001 \
    --save "$tmp/e.st" >/dev/null 2>&1 || fail "1-step run for eval"
POCL_DEVICES=basic "$clgrad" eval "$tmp/mlp.cfg" --weights "$tmp/e.st" --data "$tmp/data" 2>/dev/null | head -3 \
    >"$tmp/e1" || fail "eval"
for run in "mpi 2:pp=2" "mpi 2:tp=2" ":tp=2"; do
    POCL_DEVICES="$D2" ${run%%:*} "$clgrad" eval "$tmp/mlp.cfg" --weights "$tmp/e.st" --data "$tmp/data" --devices all \
        --parallel ${run#*:} 2>/dev/null >"$tmp/e2" || fail "eval ${run#*:} (${run%%:*})"
    [ "$(grep -c '^samples' "$tmp/e2")" -eq 1 ] || fail "eval ${run#*:} (${run%%:*}) printed no single report"
    awk 'NR == FNR { v[FNR] = $2; next } FNR <= 3 { d = $2 - v[FNR]; if (d < 0) d = -d;
         if ((FNR == 2 && d > 2e-4) || (FNR != 2 && $2 != v[FNR])) bad = 1 } END { exit bad }' "$tmp/e1" "$tmp/e2" ||
        { cat "$tmp/e1" "$tmp/e2"; fail "eval ${run#*:} (${run%%:*}): samples/loss/accuracy differ from one device"; }
done

# 4. refused: tp over ranks with running statistics
POCL_DEVICES="$D2" mpi 2 "$clgrad" train "$tmp/bn.cfg" $T --devices all --parallel tp=2 >"$tmp/o" 2>&1 &&
    fail "tp=2 over 2 ranks with batch norm was not refused"
grep -q "over 2 MPI ranks: layer 'bn1' keeps running statistics" "$tmp/o" || { tail -3 "$tmp/o"; fail "tp=2 + batch norm over ranks: no clear refusal"; }

# 5. a stopped rank under pp=2
rm -rf "$tmp/ck" "$tmp/pid"; mkdir -p "$tmp/pid"
POCL_DEVICES="$D2" mpi 2 sh -c 'echo $$ > "$0/$OMPI_COMM_WORLD_RANK"; exec "$@"' "$tmp/pid" "$clgrad" train "$tmp/mlp.cfg" \
    --data "$tmp/data" --epochs 100000 --no-eval --quiet --devices all --parallel pp=2 --checkpoint "$tmp/ck" \
    --comm-timeout 4 >"$tmp/o" 2>&1 &
job=$!; bg="$job"
i=0; while [ ! -f "$tmp/ck/last.safetensors" ] && [ $i -lt 900 ]; do sleep 0.1; i=$((i + 1)); done
if [ -f "$tmp/ck/last.safetensors" ]; then
    sleep 0.3
    victim=$(cat "$tmp/pid/1"); bg="$job $victim"
    t0=$(date +%s)
    kill -STOP "$victim"
    wait $job; rc=$?; t1=$(date +%s)
    kill -9 "$victim" 2>/dev/null
    echo "SIGSTOP of rank 1 under pp=2: job exit $rc after $((t1 - t0)) s"
    [ "$rc" -ne 0 ] || fail "SIGSTOP: the job exited 0"
    [ $((t1 - t0)) -le 15 ] || fail "SIGSTOP: the job took $((t1 - t0)) s to end (timeout 4 s)"
    grep -q "rank 1 did not answer" "$tmp/o" || { tail -5 "$tmp/o"; fail "SIGSTOP: no message naming rank 1"; }
    # the reduction rank 0 waited in: a stage's gradient all-reduce, or the epoch's loss all-reduce where
    # rank 1 stopped after its last gradient reduction of an epoch (short epochs here)
    grep -q -E "pipeline stage [01] .*gradient all-reduce|the loss all-reduce did not complete" "$tmp/o" ||
        { grep -i "rank\|error" "$tmp/o" | grep -v MPI_ABORT | head -5; fail "SIGSTOP: no message naming the stage or reduction"; }
    POCL_DEVICES=basic "$clgrad" eval "$tmp/mlp.cfg" --weights "$tmp/ck/last.safetensors" --data "$tmp/data" \
        >/dev/null 2>&1 || fail "SIGSTOP: the last checkpoint does not load"
else
    kill -9 $job 2>/dev/null; wait $job 2>/dev/null; tail -5 "$tmp/o"; fail "no checkpoint appeared"
fi
bg=""
echo "mpi hybrid: $fails failure(s)"
[ "$fails" -eq 0 ]
