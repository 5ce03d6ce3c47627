#!/bin/sh
# clgrad sweep's two targets (issue #25; results in docs/sweep.md).
#
#   bench/sweep.sh parallel [BUILD_DIR]
#     A 4-trial grid on LeNet-5 (lr x momentum, EPOCHS epochs each, default 2)
#     on POCL_DEVICES="basic basic": the trials side by side on the two
#     devices (--devices 0,1) against the same 4 trials one after another on
#     one device (--devices 0), alternating A B A B over ROUNDS rounds
#     (default 1) so the machine's load hits both alike. Target: parallel
#     <= 0.6 x sequential. LIMIT=N trains each trial on N samples (default
#     all 54000 left after the 10% validation split).
#
#   bench/sweep.sh asha [BUILD_DIR]
#     ASHA, 27 trials, reduction 3, 1 to 9 epochs on VGG-S (Fashion-MNIST),
#     against the same 27 configurations (same --seed: random and asha draw
#     the same samples) trained 9 epochs each, the full-budget baseline.
#     Target: ASHA's best within 0.3 points of the baseline's best, with <=
#     35% of its epochs. Hours on CPUs: meant for GPUs (DEVICES=gpu).
#
#   bench/sweep.sh asha [BUILD_DIR] --subset N
#     The same, scaled down to run in minutes on CPUs: every trial trains on
#     N images of the training split per epoch (the first N after the
#     hold-out: --limit-train N) and is ranked on a validation split of
#     VAL_FRACTION of the training set (default 0.01 here, 600 images;
#     else 0.1); the warm-up is scaled to half an epoch of N images.
#     Figures of this run are of the scaled-down problem, not of VGG-S on
#     the whole of Fashion-MNIST.
#
# Prints one line per run and a summary; the sweep directories stay under
# OUT (default /tmp/clgrad-bench-sweep) for their results.csv and plots.
set -u
cd "$(dirname "$0")/.."
target=${1:-parallel}
[ $# -gt 0 ] && shift
build=build
subset=${SUBSET:-}
while [ $# -gt 0 ]; do
    case "$1" in
    --subset) subset=${2:?--subset needs N}; shift 2 ;;
    --subset=*) subset=${1#--subset=}; shift ;;
    *) build=$1; shift ;;
    esac
done
clgrad="$build/tools/clgrad"
[ -x "$clgrad" ] || { echo "no $clgrad: build first" >&2; exit 2; }
out=${OUT:-/tmp/clgrad-bench-sweep}
data=${DATA:-fashion-mnist}
rm -rf "$out"
mkdir -p "$out"

# runs a sweep into $out/$1 (the rest: its options); prints its wall time in seconds
timed() {
    dir=$1; shift
    t0=$(date +%s.%N)
    "$clgrad" sweep --dir "$out/$dir" --data "$data" "$@" --json >"$out/$dir.json" 2>"$out/$dir.err" ||
        { echo "sweep $dir failed:" >&2; tail -5 "$out/$dir.err" >&2; exit 1; }
    t1=$(date +%s.%N)
    echo "$t0 $t1" | awk '{printf "%.1f\n", $2 - $1}'
}

case "$target" in
parallel)
    export POCL_DEVICES="basic basic"
    epochs=${EPOCHS:-2}
    rounds=${ROUNDS:-1}
    lim=""
    [ -n "${LIMIT:-}" ] && lim="--limit-train $LIMIT"
    grid="lenet5 --method grid --max-epochs $epochs --param lr=0.01,0.05 --param momentum=0.8,0.9 $lim"
    # one warm-up trial so neither side pays for the first kernel builds
    timed warm lenet5 --param lr=0.01 --max-epochs 1 --limit-train 512 --devices 0 >/dev/null
    r=1; par=""; seq=""
    while [ $r -le "$rounds" ]; do
        p=$(timed "par$r" $grid --devices 0,1) || exit 1
        s=$(timed "seq$r" $grid --devices 0) || exit 1
        echo "round $r: 4 trials x $epochs epochs: two devices ${p} s, one device ${s} s"
        par="$par $p"; seq="$seq $s"; r=$((r + 1))
    done
    echo "$par|$seq" | awk -F'|' '{np = split($1, a, " "); split($2, b, " "); pa = 0; sa = 0;
        for (i = 1; i <= np; i++) { pa += a[i]; sa += b[i] }
        printf "parallel / sequential: %.2f (target <= 0.60)\n", pa / sa }'
    ;;
asha)
    devices=${DEVICES:-all}
    seed=${SEED:-1}
    space="--param lr=log:0.003:0.1 --param momentum=uniform:0.8:0.95 --param weight_decay=0,0.0005"
    small="--val-fraction ${VAL_FRACTION:-0.1}"
    if [ -n "$subset" ]; then # N images an epoch; warm-up: half an epoch of them (VGG-S: batch 64)
        small="--limit-train $subset --val-fraction ${VAL_FRACTION:-0.01} --param warmup=$(( (subset + 127) / 128 ))"
        echo "scaled down: $subset training images per epoch, validation fraction ${VAL_FRACTION:-0.01}"
    fi
    a=$(timed asha vgg-s --method asha --trials 27 --reduction 3 --min-epochs 1 --max-epochs 9 --seed "$seed" \
        $space $small --devices "$devices") || exit 1
    f=$(timed full vgg-s --method random --trials 27 --max-epochs 9 --seed "$seed" $space $small --devices "$devices") ||
        exit 1
    python3 - "$out" "$a" "$f" <<'PYEOF'
import csv, sys
out, ta, tf = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
def summary(name):
    rows = list(csv.DictReader(open(f"{out}/{name}/results.csv")))
    prev, ep = {}, 0
    for r in sorted(rows, key=lambda r: (int(r["trial"]), int(r["rung"]))):
        e = int(r["epochs"]); ep += e - prev.get(r["trial"], 0); prev[r["trial"]] = e
    top = max(int(r["epochs"]) for r in rows if r["state"] == "ok")
    best = max(float(r["val_acc"]) for r in rows if r["state"] == "ok" and int(r["epochs"]) == top)
    return ep, best
ea, ba = summary("asha")
ef, bf = summary("full")
print(f"asha: best val_acc {100 * ba:.2f}% with {ea} epochs in {ta:.0f} s")
print(f"full budget (same 27 configurations x 9 epochs): best {100 * bf:.2f}% with {ef} epochs in {tf:.0f} s")
print(f"asha - full: {100 * (ba - bf):+.2f} points (target >= -0.3) with {100 * ea / ef:.0f}% of the epochs (target <= 35%)")
PYEOF
    ;;
*)
    echo "usage: bench/sweep.sh parallel|asha [BUILD_DIR] [--subset N]" >&2
    exit 2
    ;;
esac
