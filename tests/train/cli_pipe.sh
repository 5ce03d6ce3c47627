#!/bin/sh
# clgrad train --parallel pp=2 (pipeline parallelism, issue #22) on two
# devices and a tiny synthetic dataset: the partition table, checkpoints in
# the one-device format (a pp=2 checkpoint resumes on one device and a
# one-device checkpoint on pp=2; a pp=2 run resumed on pp=2 equals an
# uninterrupted one bitwise), bench train, and clear refusals of bad
# layouts. usage: cli_pipe.sh PATH/TO/clgrad PYTHON
clgrad="$1"; py="$2"
# The bitwise resume checks compare separate processes: each must pick the
# same convolution algorithms. With measuring on, a cold cache made the first
# run serve each new shape's first step with the default algorithm (the CLI's
# deferred measuring) and the resumed run the measured one: 15 of 16 tensors
# differed bitwise right after a build. The per-device default, no timing:
export CLGRAD_CONV_AUTO_MEASURE=0
st_compare="$(dirname "$0")/st_compare.py"
. "$(dirname "$0")/cli_common.sh"
cli_setup cli-pipe
need_devices 2 cli_pipe
# synthetic 8x8 data: class k = bright quadrant k (4 classes), random noise
make_idx "$tmp/data" 8 256 64 --quadrants --seed 5
# a residual block whose skip edge crosses the cut after c2
cat > "$tmp/res.cfg" <<'CFG'
[net]
channels = 1
height = 8
width = 8
classes = 4
batch = 32
learning_rate = 0.05
momentum = 0.9
[conv]
name = c1
filters = 8
size = 3
pad = 1
activation = relu
[conv]
name = c2
filters = 8
size = 3
pad = 1
bias = 0
[batchnorm]
name = bn
[add]
name = res
input = c1, bn
[maxpool]
size = 2
[dense]
name = fc
units = 4
[softmax]
name = loss
CFG
T="$clgrad train $tmp/res.cfg --data $tmp/data --seed 3 --no-eval"
check 0 "pipeline: 2 stages, 4 micro-batches of 8, schedule 1f1b" "pp=2 trains and prints its partition" -- \
    $T --devices all --parallel pp=2 --stages c2 --microbatches 4 --epochs 2 --checkpoint "$tmp/a"
n=$((n + 1)); printf '%s\n' "$out" | grep -q "carried: c1 (stage 0 -> 1" || { echo "FAIL: the residual edge c1 is not listed as carried"; printf '%s\n' "$out" | head -20; fails=$((fails + 1)); }
n=$((n + 1)); printf '%s\n' "$out" | grep -A3 "memory per device, MiB (per pipeline stage)" | grep -q "^      1       1 " ||
    { echo "FAIL: no per-stage memory table (stage 1 on device 1)"; printf '%s\n' "$out" | grep -A3 memory; fails=$((fails + 1)); }
# interrupted after epoch 1 and resumed on the same layout: bitwise the uninterrupted run
check 0 "" "pp=2, 1 epoch" -- $T --devices all --parallel pp=2 --stages c2 --microbatches 4 --epochs 1 --checkpoint "$tmp/b"
check 0 "" "pp=2 resumed to 2 epochs" -- \
    $T --devices all --parallel pp=2 --stages c2 --microbatches 4 --epochs 2 --checkpoint "$tmp/b" --resume
check 0 "" "pp=2 resumed = uninterrupted, bitwise" -- "$py" "$st_compare" "$tmp/a/last.safetensors" "$tmp/b/last.safetensors" 0
# the pp=2 checkpoint resumes on one device, and a one-device checkpoint on pp=2
cp -r "$tmp/b" "$tmp/c"
check 0 "epoch 3/3" "a pp=2 checkpoint resumes on one device" -- \
    $T --devices 0 --epochs 3 --checkpoint "$tmp/c" --resume
check 0 "epoch 4/4" "a one-device checkpoint resumes on pp=2 (gpipe, recompute)" -- \
    $T --devices all --parallel pp=2 --microbatches 4 --pipe-schedule gpipe --pipe-recompute --epochs 4 \
    --checkpoint "$tmp/c" --resume
check 0 "devices 2 .*pp=2 M=8 1f1b" "bench train pp=2" -- \
    "$clgrad" bench train --model "$tmp/res.cfg" --batch 32 --steps 2 --warmup 1 --devices all --parallel pp=2 \
    --trace "$tmp/tr.json"
n=$((n + 1)); printf '%s\n' "$out" | grep -q "pipeline bubble: the stages were idle" || { echo "FAIL: no bubble line"; fails=$((fails + 1)); }
for ev in '"forward 7"' '"backward 0"' '"send activation 3"' '"wait gradient 5"' 'device 1'; do
    n=$((n + 1)); grep -q "$ev" "$tmp/tr.json" || { echo "FAIL: the trace lacks $ev"; fails=$((fails + 1)); }
done
# the memory cap (issue #22 item 6): VGG-S at batch 32 refused on one device capped halfway between its
# peak and pp=2's trains as a 2-stage pipeline on two devices capped the same
B="$clgrad bench train --model vgg-s --batch 32 --steps 1 --warmup 0"
peak() { sed -n 's/^device memory (largest device): peak \([0-9.]*\) MiB.*/\1/p'; }
one=$($B --devices 0 2>&1 | peak)
two=$($B --devices all --parallel pp=2 --microbatches 4 2>&1 | peak)
cap=$(awk -v a="$one" -v b="$two" 'BEGIN { if (a > 0 && b > 0 && b < 0.6 * a) printf "%.2f", (a + b) / 2 }')
if [ -z "$cap" ]; then
    n=$((n + 1)); fails=$((fails + 1)); echo "FAIL: VGG-S peaks: one device '$one' MiB, pp=2 '$two' MiB (want pp=2 < 0.6x)"
else
    check 1 "refused on device 0: .* past its memory limit of $cap MiB" "one capped device refuses VGG-S" -- \
        $B --devices 0 --device-mem-limit "$cap"
    check 0 "split pp=2 M=4 1f1b" "pp=2 on two capped devices trains VGG-S" -- \
        $B --devices all --parallel pp=2 --microbatches 4 --device-mem-limit "$cap"
    # and evaluates it under the same cap (the stages' forwards in order, no whole network on device 0), and
    # saves it (the save's forward check runs on the stages too)
    make_idx "$tmp/d28" 28 64 32 --quadrants --seed 5
    check 0 "epoch 1/1.*test" "pp=2 on two capped devices trains and evaluates VGG-S" -- \
        "$clgrad" train vgg-s --data "$tmp/d28" --batch 32 --epochs 1 --seed 3 --devices all --parallel pp=2 \
        --microbatches 4 --device-mem-limit "$cap" --checkpoint "$tmp/cap"
    # clgrad eval of those weights under a cap of 17.5 MiB: refused on one device (the whole network, about 19
    # MiB), evaluated as pp=2 (one replica per stage with --pipe-recompute, about 16 MiB on device 0)
    E="$clgrad eval vgg-s --weights $tmp/cap/last.safetensors --data $tmp/d28 --batch 32"
    check 1 "past its memory limit of 17.50 MiB" "eval under a cap refused on one device" -- \
        env CLGRAD_DEVICE_MEM_LIMIT=17.5 $E --devices 0
    check 0 "accuracy" "eval under the same cap as pp=2" -- \
        env CLGRAD_DEVICE_MEM_LIMIT=17.5 $E --devices all --parallel pp=2 --microbatches 4 --pipe-recompute
    check 0 "image 1: class" "predict as pp=2" -- "$clgrad" predict vgg-s --weights "$tmp/cap/last.safetensors" \
        --input "$tmp/d28/t10k-images-idx3-ubyte" --limit 2 --devices all --parallel pp=2 --microbatches 4
    # ONNX export from the stages: the bytes of one device's export (skipped without ONNX support)
    if "$clgrad" export vgg-s --weights "$tmp/cap/last.safetensors" -o "$tmp/one.onnx" --devices 0 >/dev/null 2>&1
    then
        check 0 "" "export as pp=2" -- "$clgrad" export vgg-s --weights "$tmp/cap/last.safetensors" \
            -o "$tmp/pp.onnx" --devices all --parallel pp=2 --microbatches 4
        check 0 "" "the pp=2 export equals one device's" -- cmp "$tmp/one.onnx" "$tmp/pp.onnx"
    fi
fi
# the default partition within each device's cap (issue #22 item 4): an MLP whose time-balanced cut (after fc2,
# the big layer, on stage 0 with its two stash slots) exceeds a 24 MiB cap moves the cut before fc2 and trains;
# the time-balanced cut forced with --stages is refused
cat > "$tmp/mlp.cfg" <<'CFG'
[net]
channels = 1
height = 8
width = 8
classes = 4
batch = 32
learning_rate = 0.05
momentum = 0.9
[dense]
name = fc1
units = 256
activation = relu
[dense]
name = fc2
units = 4096
activation = relu
[dense]
name = fc3
units = 64
activation = relu
[dense]
name = fc4
units = 4
[softmax]
name = loss
CFG
M="$clgrad train $tmp/mlp.cfg --data $tmp/data --seed 3 --epochs 1 --devices all --parallel pp=2 --microbatches 4"
check 0 "cut moved so that every stage fits its device's memory limit" "the default cut moves to fit a cap" -- \
    $M --device-mem-limit 24
check 1 "past its memory limit of 24.00 MiB" "the time-balanced cut exceeds the cap" -- \
    $M --device-mem-limit 24 --stages fc2
# refusals
check 1 "pp=2 needs 2 devices, 1 selected" "pp=2 on one device" -- $T --devices 0 --parallel pp=2 --steps 1
check 1 "'nosuch' is not a layer" "an unknown --stages name" -- \
    $T --devices all --parallel pp=2 --stages nosuch --steps 1
check 1 "2 stages need 1 cut" "too many cuts" -- $T --devices all --parallel pp=2 --stages c1,c2 --steps 1
check 1 "pp=3 needs 3 devices, 2 selected" "more stages than devices" -- $T --devices all --parallel pp=3 --steps 1
check 1 "9 stages but .* has only 7 layers" "more stages than layers" -- $T --devices all --parallel pp=9 --steps 1
check 1 "dp=2 x pp=2 needs 4 devices, 2 selected" "dp x pp on two devices" -- \
    $T --devices all --parallel dp=2,pp=2 --steps 1
check 1 "pp=2,tp=2 needs 4 devices, 2 selected" "pp x tp on two devices" -- \
    $T --devices all --parallel pp=2,tp=2 --steps 1
check 1 "expected items dp=N, pp=N" "a malformed layout" -- $T --devices all --parallel pp=two --steps 1
check 1 "need a pipeline" "--microbatches without pp" -- $T --devices all --microbatches 4 --steps 1
check 0 "epoch 1/1" "pp=2 with fp16 storage trains" -- \
    $T --devices all --parallel pp=2 --stages c2 --microbatches 4 --precision fp16 --epochs 1
check 2 "gpipe" "an unknown schedule" -- $T --devices all --parallel pp=2 --pipe-schedule zigzag --steps 1
echo "cli_pipe: $((n - fails))/$n passed"
[ "$fails" -eq 0 ]
