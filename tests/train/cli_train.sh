#!/bin/sh
# clgrad train / eval / predict / bench train on a tiny synthetic IDX dataset:
# outputs, exit codes (0 ok, 1 failure, 2 usage) and clear messages for bad
# input. usage: cli_train.sh PATH/TO/clgrad PYTHON
clgrad="$1"; py="$2"
. "$(dirname "$0")/cli_common.sh"
cli_setup cli-train
# synthetic 8x8 data: class k = bright quadrant k (4 classes), random noise
make_idx "$tmp/data" 8 256 64 --quadrants
make_mlp "$tmp/mlp.cfg"
cat > "$tmp/other.cfg" <<'CFG'
[net]
channels = 1
height = 8
width = 8
classes = 4
[dense]
name = fc1
units = 8
[dense]
name = fc2
units = 4
[softmax]
CFG
printf '[net]\nchannels = 1\nthis is not a key value line\n' > "$tmp/bad.cfg"
printf '[net]\nchannels = 1\nheight = 8\nwidth = 8\n[dense]\nunits = 4\n[frobnicate]\n' > "$tmp/unknown.cfg"

check 0 "test loss" "train runs, evaluates and saves" -- \
    "$clgrad" train "$tmp/mlp.cfg" --data "$tmp/data" --epochs 2 --checkpoint "$tmp/ck" --log "$tmp/run.csv" \
    --save "$tmp/w.safetensors" --seed 3
for f in ck/last.safetensors run.csv run.svg w.safetensors; do
    n=$((n + 1)); [ -s "$tmp/$f" ] || { echo "FAIL: $f missing"; fails=$((fails + 1)); }
done
n=$((n + 1)); [ "$(wc -l < "$tmp/run.csv")" -eq 3 ] || { echo "FAIL: run.csv should have a header and 2 rows"; fails=$((fails + 1)); }
check 0 "epoch 3/3" "resume continues at epoch 3" -- \
    "$clgrad" train "$tmp/mlp.cfg" --data "$tmp/data" --epochs 3 --checkpoint "$tmp/ck" --log "$tmp/run.csv" --resume --seed 3
n=$((n + 1)); [ "$(wc -l < "$tmp/run.csv")" -eq 4 ] || { echo "FAIL: resumed run.csv should have 3 rows"; fails=$((fails + 1)); }
check 0 "steps in [0-9.]* s ([0-9]* images/s)" "the final summary of an image model in images/s" -- \
    "$clgrad" train "$tmp/mlp.cfg" --data "$tmp/data" --epochs 1 --steps 1 --no-eval --quiet
check 0 "confusion matrix" "eval" -- "$clgrad" eval "$tmp/mlp.cfg" --weights "$tmp/w.safetensors" --data "$tmp/data"
check 0 "image 63: class" "predict on an IDX file" -- \
    "$clgrad" predict "$tmp/mlp.cfg" --weights "$tmp/w.safetensors" --input "$tmp/data/t10k-images-idx3-ubyte"
check 0 '"images_per_s"' "bench train --json" -- "$clgrad" bench train --model "$tmp/mlp.cfg" --batch 16 --steps 3 --json
check 0 '"launches_per_step": [1-9]' "bench train --json counts launches" -- \
    "$clgrad" bench train --model "$tmp/mlp.cfg" --batch 16 --steps 2 --json
# the warm-up steps run (3 asked; more while a split over several devices settles) and nothing met in the timed steps
check 0 '"warmup_run": [3-9][0-9]*, "split_moves_timed": [0-9]*, "prepares_timed": 0, "prepare_timed_s": 0.000, "cpu_ms_per_step": [0-9]' \
    "bench train --json reports the warm-up run and the timed steps' preparations" -- \
    "$clgrad" bench train --model "$tmp/mlp.cfg" --batch 16 --steps 2 --split even --json
# bench start: a cold and a warm process; the times must be consistent
# (setup + first step within the time to the first step, within the process).
# The runs on empty caches here take one device: every program is built per
# device, and one shows what two would.
n=$((n + 1))
run "$clgrad" bench start --model "$tmp/mlp.cfg" --batch 16 --warm 1 --devices 0 --json
if [ "$rc" -ne 0 ] || ! printf '%s\n' "$out" | grep '^{' | "$py" -c '
import json, sys
d = json.loads(sys.stdin.read())
for k in ("cold", "warm"):
    r = d[k]
    assert 0 < r["setup_s"] and 0 < r["first_step_s"] and 0 < r["cpu_to_first_step_s"], r
    assert r["setup_s"] + r["first_step_s"] <= r["to_first_step_s"] <= r["process_s"], r
assert len(d["warm_to_first_step_s"]) == 1
'; then
    echo "FAIL: bench start --json: exit $rc"; printf '%s\n' "$out" | tail -8
    fails=$((fails + 1))
fi
check 2 "missing --model" "bench start without a model" -- "$clgrad" bench start
# precompile: on an empty cache a run builds programs from source; after
# `clgrad precompile` a run of the same model and batch builds none
pc="$tmp/pcache"
# (a and the helper's pair below take the stored or default GEMM backend, not
# timing both per shape: the pair's results cannot differ by a timed choice)
check 0 '"programs_built": [1-9]' "bench train on an empty cache builds programs" -- \
    env CLGRAD_CACHE_DIR="$pc/a" POCL_CACHE_DIR="$pc/a/pocl" CLGRAD_PRECOMPILE=0 CLGRAD_GEMM_AUTO_MEASURE=0 \
    "$clgrad" bench train --model "$tmp/mlp.cfg" --batch 16 --steps 2 --devices 0 --json
check 0 "precompiled" "precompile" -- env CLGRAD_CACHE_DIR="$pc/b" POCL_CACHE_DIR="$pc/b/pocl" \
    "$clgrad" precompile "$tmp/mlp.cfg" --batch 16 --devices 0
check 0 '"programs_built": 0,' "a run after precompile builds no program" -- \
    env CLGRAD_CACHE_DIR="$pc/b" POCL_CACHE_DIR="$pc/b/pocl" CLGRAD_PRECOMPILE=0 \
    "$clgrad" bench train --model "$tmp/mlp.cfg" --batch 16 --steps 2 --devices 0 --json
# (reverse order on a cold cache is what the helper below runs)
check 0 "precompiled" "precompile --order reverse" -- env CLGRAD_CACHE_DIR="$pc/b" POCL_CACHE_DIR="$pc/b/pocl" \
    "$clgrad" precompile "$tmp/mlp.cfg" --batch 16 --devices 0 --order reverse
check 2 "missing MODEL" "precompile without a model" -- "$clgrad" precompile
check 1 "nowhere.cfg" "precompile of a missing model file" -- "$clgrad" precompile "$tmp/nowhere.cfg"
# the background helper (forced on a cold cache) changes no result: same
# seed, same test loss and accuracy as a run without it (which needs no cold
# cache of its own: it reuses the first empty-cache run's)
for h in 0 1; do
    c="$pc/h1"; [ $h = 1 ] || c="$pc/a"
    run env CLGRAD_CACHE_DIR="$c" POCL_CACHE_DIR="$c/pocl" CLGRAD_PRECOMPILE=$h CLGRAD_GEMM_AUTO_MEASURE=0 \
        "$clgrad" train "$tmp/mlp.cfg" --data "$tmp/data" --epochs 2 --seed 5 --devices 0
    printf '%s\n' "$out" | grep -i "test loss" | tail -1 > "$pc/h$h.txt"
    n=$((n + 1))
    [ "$rc" -eq 0 ] || { echo "FAIL: train with CLGRAD_PRECOMPILE=$h: exit $rc"; printf '%s\n' "$out" | tail -5; fails=$((fails + 1)); }
done
n=$((n + 1))
if [ ! -s "$pc/h0.txt" ] || ! cmp -s "$pc/h0.txt" "$pc/h1.txt"; then
    echo "FAIL: training with the precompile helper differs from training without:"; cat "$pc/h0.txt" "$pc/h1.txt"
    fails=$((fails + 1))
fi

# usage errors: 2
check 2 "missing --data" "train without --data" -- "$clgrad" train "$tmp/mlp.cfg"
check 2 "missing MODEL" "train without a model" -- "$clgrad" train --data "$tmp/data"
check 2 "unknown option" "train with a bad flag" -- "$clgrad" train "$tmp/mlp.cfg" --data x --frobnicate
check 2 "integer" "train with a bad number" -- "$clgrad" train "$tmp/mlp.cfg" --data x --epochs two
check 2 "missing --weights" "eval without weights" -- "$clgrad" eval "$tmp/mlp.cfg" --data "$tmp/data"
check 2 "missing --input" "predict without input" -- "$clgrad" predict "$tmp/mlp.cfg" --weights "$tmp/w.safetensors"
check 2 "missing --model" "bench train without a model" -- "$clgrad" bench train

# bad input: 1 with a message naming the problem
check 1 "bad.cfg:3" "malformed model file names the line" -- "$clgrad" train "$tmp/bad.cfg" --data "$tmp/data"
check 1 "unknown.cfg:7: unknown section type \[frobnicate\]" "unknown section" -- \
    "$clgrad" train "$tmp/unknown.cfg" --data "$tmp/data"
check 1 "nowhere" "missing dataset" -- "$clgrad" train "$tmp/mlp.cfg" --data "$tmp/nowhere"
check 1 "model.cfg" "missing model file" -- "$clgrad" train "$tmp/model.cfg" --data "$tmp/data"
check 0 "final loss scale" "train --precision fp16" -- \
    "$clgrad" train "$tmp/mlp.cfg" --data "$tmp/data" --epochs 2 --precision fp16 --checkpoint "$tmp/ck16" --seed 3
check 0 "test loss" "train --precision fp16 --resume" -- \
    "$clgrad" train "$tmp/mlp.cfg" --data "$tmp/data" --epochs 3 --precision fp16 --checkpoint "$tmp/ck16" --resume --seed 3
check 1 "trained with --precision fp16, this run uses fp32" "resume an fp16 checkpoint in fp32" -- \
    "$clgrad" train "$tmp/mlp.cfg" --data "$tmp/data" --epochs 4 --checkpoint "$tmp/ck16" --resume --seed 3
check 0 '"precision": "fp16"' "bench train --precision fp16 --json" -- \
    "$clgrad" bench train --model "$tmp/mlp.cfg" --batch 16 --steps 3 --precision fp16 --json
check 2 "fp32 or fp16" "unknown precision" -- "$clgrad" train "$tmp/mlp.cfg" --data "$tmp/data" --precision fp8
check 1 "fc1.weight" "checkpoint of another model" -- \
    "$clgrad" eval "$tmp/other.cfg" --weights "$tmp/w.safetensors" --data "$tmp/data"
sed 's/height = 8/height = 9/' "$tmp/mlp.cfg" > "$tmp/tall.cfg"
check 1 "expects 1x9x8" "dataset shape mismatch" -- "$clgrad" train "$tmp/tall.cfg" --data "$tmp/data"
# corrupted checkpoints: flipped data byte (CRC), truncated file, absurd header length
cp "$tmp/w.safetensors" "$tmp/crc.safetensors"
size=$(wc -c < "$tmp/w.safetensors")
printf '\377' | dd of="$tmp/crc.safetensors" bs=1 seek=$((size - 5)) conv=notrunc 2>/dev/null
check 1 "crc\|CRC\|checksum" "checkpoint with a bad CRC" -- \
    "$clgrad" eval "$tmp/mlp.cfg" --weights "$tmp/crc.safetensors" --data "$tmp/data"
head -c $((size / 2)) "$tmp/w.safetensors" > "$tmp/trunc.safetensors"
check 1 "trunc.safetensors" "truncated checkpoint" -- \
    "$clgrad" eval "$tmp/mlp.cfg" --weights "$tmp/trunc.safetensors" --data "$tmp/data"
printf '\377\377\377\377\377\377\377\177{}' > "$tmp/hdr.safetensors"
check 1 "hdr.safetensors" "header length too large" -- \
    "$clgrad" predict "$tmp/mlp.cfg" --weights "$tmp/hdr.safetensors" --input "$tmp/data/t10k-images-idx3-ubyte"
check 1 "resume.*last.safetensors" "resume without a checkpoint" -- \
    "$clgrad" train "$tmp/mlp.cfg" --data "$tmp/data" --checkpoint "$tmp/none" --resume
# a failed run never replaces an earlier checkpoint
cp "$tmp/ck/last.safetensors" "$tmp/before.safetensors"
check 1 "precision" "failing run with the same checkpoint dir" -- \
    "$clgrad" train "$tmp/mlp.cfg" --data "$tmp/data" --epochs 4 --checkpoint "$tmp/ck" --resume --precision fp16
n=$((n + 1)); cmp -s "$tmp/ck/last.safetensors" "$tmp/before.safetensors" || { echo "FAIL: checkpoint changed"; fails=$((fails + 1)); }

# data parallelism (the test environment has two PoCL devices)
ndev=$(POCL_DEVICES="$POCL_DEVICES" "$clgrad" devices 2>/dev/null | grep -c '^ *[0-9]')
if [ "$ndev" -ge 2 ]; then
    check 0 "devices 2, batch split" "train on every device" -- \
        "$clgrad" train "$tmp/mlp.cfg" --data "$tmp/data" --epochs 1 --devices all --checkpoint "$tmp/ckdp" --seed 5
    check 0 "note: resuming a checkpoint written on 2 device" "resume onto one device says so" -- \
        "$clgrad" train "$tmp/mlp.cfg" --data "$tmp/data" --epochs 2 --devices 0 --checkpoint "$tmp/ckdp" --resume --seed 5
    check 0 '"devices": 2, .*"shares": "0\.[0-9][0-9]/0\.[0-9][0-9]"' "bench train on two devices reports the shares" -- \
        "$clgrad" bench train --model "$tmp/mlp.cfg" --batch 16 --steps 3 --json
    check 0 "split 0.75/0.25" "fixed split weights" -- \
        "$clgrad" bench train --model "$tmp/mlp.cfg" --batch 16 --steps 2 --split 3,1
    check 2 "option --split wants auto, even, or weights" "bad split" -- "$clgrad" bench train --model "$tmp/mlp.cfg" --steps 2 --split x,y
    check 0 "images/s" "bench train --trace" -- \
        "$clgrad" bench train --model "$tmp/mlp.cfg" --batch 16 --steps 2 --bucket-mb 0.001 --trace "$tmp/trace.json"
    n=$((n + 1))
    "$py" - "$tmp/trace.json" <<'PYEOF' || { echo "FAIL: trace"; fails=$((fails + 1)); }
import json, sys
ev = json.load(open(sys.argv[1]))["traceEvents"]
names = {e["name"].split(" bucket")[0] for e in ev if e["ph"] == "X"}
lanes = {e["pid"] for e in ev if e["ph"] == "X"}
want = {"fwd fc1", "bwd fc1", "optimizer", "upload", "grad read", "grad write", "wait own", "sum"}
assert lanes == {0, 1}, lanes
assert want <= names, want - names
assert all(e["dur"] >= 0 for e in ev if e["ph"] == "X")
PYEOF
fi
# a diverging run fails at once and writes no checkpoint
check 1 "diverged" "diverging run" -- \
    "$clgrad" train "$tmp/mlp.cfg" --data "$tmp/data" --epochs 1 --lr 1e30 --checkpoint "$tmp/ckdiv" --save "$tmp/div.safetensors"
n=$((n + 1)); [ ! -e "$tmp/ckdiv/last.safetensors" ] && [ ! -e "$tmp/div.safetensors" ] || { echo "FAIL: diverged weights saved"; fails=$((fails + 1)); }

echo "$n checks, $fails failed"
[ "$fails" -eq 0 ]
