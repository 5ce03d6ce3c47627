#!/bin/sh
# clgrad train --shard-optimizer and --device-mem-limit on two devices and a
# tiny synthetic IDX dataset: the memory table, a checkpoint (weights and
# Adam state) bitwise equal to the unsharded run's, the cap's refusal naming
# the device, usage errors. usage: cli_shard.sh PATH/TO/clgrad PYTHON
clgrad="$1"; py="$2"
here=$(dirname "$0")
. "$(dirname "$0")/cli_common.sh"
cli_setup cli-shard
need_devices 2 cli_shard
make_idx "$tmp/data" 8 256 64 --quadrants
cat > "$tmp/mlp.cfg" <<'CFG'
[net]
channels = 1
height = 8
width = 8
classes = 4
batch = 32
optimizer = adam
learning_rate = 0.01
[dense]
name = fc1
units = 48
activation = relu
[dense]
name = fc
units = 4
[softmax]
name = loss
CFG
# own GEMM kernels and the host reduction: no start-up timing that could choose differently in the two
# runs (the device-to-device reduction sums the clip norm in float, the host in double)
export CLGRAD_DP_REDUCE=host
common="$tmp/mlp.cfg --data $tmp/data --devices all --split even --steps 6 --no-eval --clip-norm 0.5 --quiet --gemm-backend own"
check 0 "" "unsharded run" -- "$clgrad" train $common --checkpoint "$tmp/u"
check 0 "" "sharded run" -- "$clgrad" train $common --checkpoint "$tmp/s" --shard-optimizer
check 0 "" "sharded checkpoint bitwise the unsharded one (weights, Adam state)" -- \
    "$py" "$here/st_compare.py" "$tmp/u/last.safetensors" "$tmp/s/last.safetensors" 0
check 0 "opt.v.fc1.weight" "the checkpoint holds the second moment" -- \
    grep -a -o "opt.v.fc1.weight" "$tmp/s/last.safetensors"
check 0 "optimizer state sharded" "memory table before training" -- \
    "$clgrad" train "$tmp/mlp.cfg" --data "$tmp/data" --devices all --steps 1 --no-eval --shard-optimizer
check 1 "refused on device 0: .* past its memory limit of 0.05 MiB (device_mem_limit, --device-mem-limit)" \
    "the cap refuses, naming the device" -- "$clgrad" train $common --device-mem-limit 0.05
check 2 "device-mem-limit" "a negative cap is a usage error" -- "$clgrad" train $common --device-mem-limit -1
check 2 "shard-optimizer" "--shard-optimizer takes no value" -- "$clgrad" train $common --shard-optimizer=1
echo "$((n - fails)) of $n checks passed"
[ "$fails" -eq 0 ]
