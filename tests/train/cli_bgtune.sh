#!/bin/sh
# Background GEMM tuning (option background_tune): a `clgrad train` run on a
# fresh cache starts a detached `clgrad tune --background` for the GEMM
# shapes it ran without measurements of their own; the helper writes them to
# the tuning database, `clgrad devices` then reports own measurements, and a
# second run (finding every class tuned) starts no helper. With
# background_tune=off no helper starts. (The MLP's first layer is a product
# of 64 x 1024 x 1024: above the size that runs unpacked, untunable.)
# usage: cli_bgtune.sh PATH/TO/clgrad PYTHON
clgrad="$1"; py="$2"
. "$(dirname "$0")/cli_common.sh"
cli_setup bgtune
export CLGRAD_CACHE_DIR="$tmp/cache" CLGRAD_BACKGROUND_TUNE_WAIT=0 CLGRAD_PRECOMPILE=0
"$py" - "$tmp/data" <<'PYEOF' || fail_now "cannot write the dataset"
import os, random, struct, sys
d = sys.argv[1]; os.makedirs(d)
rng = random.Random()
for split, n in (("train", 128), ("t10k", 32)):
    imgs = bytes(rng.randrange(256) for _ in range(n * 1024))
    labs = bytes(rng.randrange(4) for _ in range(n))
    open(f"{d}/{split}-images-idx3-ubyte", "wb").write(struct.pack(">IIII", 0x803, n, 32, 32) + imgs)
    open(f"{d}/{split}-labels-idx1-ubyte", "wb").write(struct.pack(">II", 0x801, n) + labs)
PYEOF
printf '[net]\nchannels = 1\nheight = 32\nwidth = 32\nclasses = 4\nbatch = 64\n[dense]\nunits = 1024\nactivation = relu\n[dense]\nunits = 4\n[softmax]\n' > "$tmp/mlp.cfg"

CLGRAD_BACKGROUND_TUNE=off "$clgrad" train "$tmp/mlp.cfg" --data "$tmp/data" --epochs 1 --devices 0 --verbose \
    > "$tmp/off.log" 2>&1 || { tail "$tmp/off.log"; fail_now "train (background_tune=off)"; }
grep -q "background GEMM tuning" "$tmp/off.log" && fail_now "background_tune=off started a helper"

# quick: the helper's quick pass only (auto's full pass adds ~20 s of kernel builds on a loaded CI machine)
CLGRAD_BACKGROUND_TUNE=quick "$clgrad" train "$tmp/mlp.cfg" --data "$tmp/data" --epochs 1 --devices 0 --verbose \
    > "$tmp/run1.log" 2>&1 || { tail "$tmp/run1.log"; fail_now "first train"; }
line=$(grep "started background GEMM tuning" "$tmp/run1.log") || { tail "$tmp/run1.log"; fail_now "no helper started"; }
echo "$line"
pid=$(echo "$line" | sed -n 's/.*(pid \([0-9]*\)).*/\1/p')
[ -n "$pid" ] || fail_now "no pid in '$line'"
i=0
while kill -0 "$pid" 2>/dev/null; do
    i=$((i + 1)); [ $i -le 600 ] || { kill "$pid"; fail_now "helper still running after 300 s"; }
    sleep 0.5
done
ls "$CLGRAD_CACHE_DIR"/tune/*.json >/dev/null 2>&1 || fail_now "the helper wrote no tuning database"
grep -q '"gemm/M' "$CLGRAD_CACHE_DIR"/tune/*.json || fail_now "no GEMM entries in $(cat "$CLGRAD_CACHE_DIR"/tune/*.json)"
"$clgrad" devices --devices 0 | grep "GEMM tuning" | tee "$tmp/dev.log"
grep -q "own measurements" "$tmp/dev.log" || fail_now "clgrad devices does not report own measurements"

CLGRAD_BACKGROUND_TUNE=auto "$clgrad" train "$tmp/mlp.cfg" --data "$tmp/data" --epochs 1 --devices 0 --verbose \
    > "$tmp/run2.log" 2>&1 || { tail "$tmp/run2.log"; fail_now "second train"; }
grep "background GEMM tuning" "$tmp/run2.log" && fail_now "the second run found untuned shapes again"
echo "ok: helper tuned the run's shapes; the next run found them"
