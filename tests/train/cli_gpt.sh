#!/bin/sh
# gpt-tiny (tests/train/gpt-tiny.cfg: gpt-mini's blocks, 2 of them, width 32,
# context 32) through the command line (issue 23 item 7): a run stopped
# mid-epoch and resumed equals an uninterrupted one bitwise (1 device; 2
# devices; fp16 storage on 1 and 2 devices), bench train reports
# tokens/s, --trace records the transformer layers on both devices, and bad
# model files and data are refused naming the file and line (or offset).
# usage: cli_gpt.sh PATH/TO/clgrad PYTHON SRCDIR
clgrad="$1"; py="$2"; src="$3"
cfg="$src/tests/train/gpt-tiny.cfg"
. "$(dirname "$0")/cli_common.sh"
cli_setup cli-gpt
same() { # same A B DESCRIPTION: bitwise equal weights
    n=$((n + 1))
    "$py" "$src/tests/train/st_compare.py" "$1" "$2" 0 || { echo "FAIL: $3"; fails=$((fails + 1)); }
}
# a text of random words (fresh each run), 3000 bytes: the head (2700) holds 81 windows of 33 bytes, 10 steps of 8
make_words "$tmp/corpus.txt" 3000
unset CLGRAD_DP_REDUCE CLGRAD_GEMM_BACKEND

# resume is bitwise: 2 epochs (20 steps) straight vs stopped at step 13 (mid-epoch 2) and resumed
resume() { # resume TAG OPTIONS...
    tag=$1; shift
    check 0 "bits per byte" "$tag: 2 epochs straight" -- \
        "$clgrad" train "$cfg" --data "text:$tmp/corpus.txt" --epochs 2 --seed 5 "$@" --save "$tmp/$tag-a.safetensors"
    check 0 "" "$tag: stopped at step 13 with a checkpoint" -- \
        "$clgrad" train "$cfg" --data "text:$tmp/corpus.txt" --epochs 2 --seed 5 "$@" --checkpoint "$tmp/ck-$tag" --steps 13
    check 0 "bits per byte" "$tag: resumed to the end" -- \
        "$clgrad" train "$cfg" --data "text:$tmp/corpus.txt" --epochs 2 --seed 5 "$@" --checkpoint "$tmp/ck-$tag" \
        --resume --save "$tmp/$tag-b.safetensors"
    same "$tmp/$tag-a.safetensors" "$tmp/$tag-b.safetensors" "$tag: the resumed run's weights differ from the uninterrupted run's"
}
resume one --devices 0
resume two --split even
resume fp16 --devices 0 --precision fp16
resume two16 --split even --precision fp16
# the fp16 run trained: finite weights, different from the fp32 run's (fp16 storage was used)
n=$((n + 1))
"$py" - "$tmp/one-a.safetensors" "$tmp/fp16-a.safetensors" <<'PYEOF' || { echo "FAIL: fp16 weights"; fails=$((fails + 1)); }
import json, math, struct, sys
def load(p):
    raw = open(p, "rb").read(); (h,) = struct.unpack("<Q", raw[:8]); head = json.loads(raw[8:8 + h])
    return {k: struct.unpack("<%df" % ((v["data_offsets"][1] - v["data_offsets"][0]) // 4),
                             raw[8 + h + v["data_offsets"][0]:8 + h + v["data_offsets"][1]])
            for k, v in head.items() if k != "__metadata__" and v["dtype"] == "F32"}
a, b = load(sys.argv[1]), load(sys.argv[2])
assert len(b) >= 20, len(b)
assert all(math.isfinite(x) for t in b.values() for x in t), "non-finite fp16 weights"
assert any(a[k] != b[k] for k in b), "fp16 weights equal the fp32 ones"
PYEOF

# bench train: tokens/s beside images/s
check 0 "images/s ([0-9]* tokens/s, 32 per sample)" "bench train reports tokens/s" -- \
    "$clgrad" bench train --model "$cfg" --batch 4 --steps 2 --warmup 1
check 0 '"tokens_per_sample": 32, "tokens_per_s": [0-9]' "bench train --json: tokens_per_s" -- \
    "$clgrad" bench train --model "$cfg" --batch 4 --steps 2 --warmup 1 --json --devices 0
run "$clgrad" bench train --model "$cfg" --batch 4 --steps 2 --warmup 1 --json --devices 0 --precision fp16
n=$((n + 1))
printf '%s\n' "$out" | grep -q '"precision": "fp16".*"tokens_per_s": [0-9]' || { echo "FAIL: bench train fp16: $out" | tail -3; fails=$((fails + 1)); }
# --trace: the transformer layers' forward and backward on both devices (bench train and train)
check 0 "tokens/s" "bench train --trace" -- \
    "$clgrad" bench train --model "$cfg" --batch 8 --steps 2 --warmup 1 --split even --trace "$tmp/trace.json"
check 0 "trained" "train --trace" -- \
    "$clgrad" train "$cfg" --data "text:$tmp/corpus.txt" --steps 3 --split even --trace "$tmp/trace2.json"
for t in trace.json trace2.json; do
    n=$((n + 1))
    "$py" - "$tmp/$t" <<'PYEOF' || { echo "FAIL: $t"; fails=$((fails + 1)); }
import json, sys
ev = json.load(open(sys.argv[1]))["traceEvents"]
names = {e["name"] for e in ev if e["ph"] == "X"}
lanes = {e["pid"] for e in ev if e["ph"] == "X"}
want = {"fwd tok", "fwd pos", "fwd b1_ln1", "fwd b1_attn", "fwd b2_fc", "fwd head", "fwd loss",
        "bwd tok", "bwd pos", "bwd b1_ln1", "bwd b1_attn", "bwd b2_fc", "bwd head", "optimizer"}
assert lanes == {0, 1}, lanes
assert want <= names, sorted(want - names)
assert all(e["dur"] >= 0 for e in ev if e["ph"] == "X")
PYEOF
done

# bad model files: file and line
line() { grep -n "$1" "$cfg" | head -1 | cut -d: -f1; }
l=$(line "heads = 2"); sed "${l}s/heads = 2/heads = 3/" "$cfg" > "$tmp/heads3.cfg"
l=$(line "^\[attention\]") # the width is known in set-up: the layer's line
check 1 "heads3.cfg:$l: layer 'b1_attn' (attention).*heads = 3 does not divide the width C = 32" "attention heads not dividing the width" -- \
    "$clgrad" train "$tmp/heads3.cfg" --data "text:$tmp/corpus.txt" --steps 1 --quiet
l=$(line "vocab = 256"); sed "${l}s/vocab = 256/vocab = 0/" "$cfg" > "$tmp/vocab0.cfg"
check 1 "vocab0.cfg:$l" "embedding vocab 0" -- \
    "$clgrad" train "$tmp/vocab0.cfg" --data "text:$tmp/corpus.txt" --steps 1 --quiet
# a byte id beyond a 64-token vocabulary (classes, embedding and tied head 64) in the data: file and offset
sed 's/^classes = 256/classes = 64/; s/^vocab = 256/vocab = 64/; s/^units = 256/units = 64/' "$cfg" > "$tmp/v64.cfg"
"$py" -c 'import sys; b = bytearray(i % 60 for i in range(3000)); b[1234] = 100; open(sys.argv[1], "wb").write(b)' "$tmp/ids.bin"
check 1 "ids.bin: byte 100 at offset 1234 is not a token id of model .*v64.cfg (its classes: 64)" \
    "a token id beyond the vocabulary" -- \
    "$clgrad" train "$tmp/v64.cfg" --data "text:$tmp/ids.bin" --steps 1 --quiet
"$py" -c 'import sys; open(sys.argv[1], "wb").write(bytearray(i % 60 for i in range(3000)))' "$tmp/ids_ok.bin"
check 0 "trained" "ids within the vocabulary train" -- \
    "$clgrad" train "$tmp/v64.cfg" --data "text:$tmp/ids_ok.bin" --steps 2
cli_done
