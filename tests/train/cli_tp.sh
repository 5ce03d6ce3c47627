#!/bin/sh
# clgrad train / bench train --parallel tp=2 (tensor parallelism, issue #22)
# on two devices and a tiny synthetic dataset: the split pairs and a memory
# row per device printed, a tp=2 checkpoint resuming on one device and a
# one-device checkpoint on tp=2 (the same final loss as the uninterrupted
# one-device run, printed to 4 digits), bench train with a trace, refusals.
# usage: cli_tp.sh PATH/TO/clgrad PYTHON
clgrad="$1"; py="$2"
export CLGRAD_CONV_AUTO_MEASURE=0
. "$(dirname "$0")/cli_common.sh"
cli_setup cli-tp
need_devices 2 cli_tp
make_idx "$tmp/data" 8 256 64 --quadrants --seed 5
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
units = 32
[activation]
type = relu
[dropout]
p = 0.1
[dense]
name = fc2
units = 16
[activation]
type = relu
[dense]
name = fc3
units = 4
[softmax]
name = loss
CFG
T="$clgrad train $tmp/mlp.cfg --data $tmp/data --seed 3 --no-eval"
final() { printf '%s\n' "$out" | sed -n 's/^train loss \([0-9.]*\) .*/\1/p'; }
check 0 "split: fc1 (outputs: 16 of 32 per device) -> fc2" "tp=2 trains and prints its split" -- \
    $T --devices all --parallel tp=2 --epochs 1 --checkpoint "$tmp/a"
n=$((n + 1)); printf '%s\n' "$out" | grep -A3 "memory per device, MiB" | grep -q "^       1 " ||
    { echo "FAIL: no memory row for device 1"; printf '%s\n' "$out" | grep -A3 memory; fails=$((fails + 1)); }
cp -r "$tmp/a" "$tmp/b"
check 0 "epoch 3/3" "the one-device run, uninterrupted" -- $T --devices 0 --epochs 3 --checkpoint "$tmp/one"
ref=$(final)
check 0 "epoch 3/3" "a tp=2 checkpoint resumes on one device" -- $T --devices 0 --epochs 3 --checkpoint "$tmp/a" --resume
a=$(final)
check 0 "epoch 3/3" "and on tp=2" -- $T --devices all --parallel tp=2 --epochs 3 --checkpoint "$tmp/b" --resume
b=$(final)
n=$((n + 1))
[ -n "$ref" ] && [ "$a" = "$ref" ] && [ "$b" = "$ref" ] ||
    { echo "FAIL: final train loss one device $ref, tp=2 then one device $a, tp=2 throughout $b"; fails=$((fails + 1)); }
check 0 "devices 2 .*tp=2" "bench train tp=2" -- \
    "$clgrad" bench train --model "$tmp/mlp.cfg" --batch 32 --steps 2 --warmup 1 --devices all --parallel tp=2 \
    --trace "$tmp/tr.json"
for ev in '"all-reduce output of fc2"' '"backward"' '"optimizer"'; do
    n=$((n + 1)); grep -q "$ev" "$tmp/tr.json" || { echo "FAIL: the trace lacks $ev"; fails=$((fails + 1)); }
done
check 1 "tp=2 needs 2 devices, 1 selected" "tp=2 on one device" -- $T --devices 0 --parallel tp=2 --steps 1
check 1 "has no layer tensor parallelism can split" "tp on a model without pairs (resnet-mini)" -- \
    "$clgrad" train "$(dirname "$0")/../../models/resnet-mini.cfg" --data "$tmp/data" --devices all --parallel tp=2 \
    --steps 1
check 0 "split: fc1 (outputs: 16 of 32 per device)" "tp=2 with fp16 storage trains" -- \
    $T --devices all --parallel tp=2 --precision fp16 --steps 3
echo "cli_tp: $((n - fails))/$n passed"
[ "$fails" -eq 0 ]
