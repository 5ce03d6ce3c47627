#!/bin/sh
# Text data through the command line (--data text:FILE): a token model
# trains, evaluates (loss and bits per byte on the held-out tail) and resumes
# bitwise from a checkpoint taken mid-epoch; wrong pairings of model and data
# and bad text files are refused naming the file and the sizes.
# usage: cli_text.sh PATH/TO/clgrad PYTHON SRCDIR [gpt]
# With "gpt": only the shipped models/gpt-mini.cfg, trained for 2 steps; it
# skips (exit 77) while a layer type it uses is unknown to this build (the
# transformer layers land separately).
clgrad="$1"; py="$2"; src="$3"; mode="$4"
. "$(dirname "$0")/cli_common.sh"
cli_setup cli-text
# a text of random words (fresh each run), 6000 bytes
make_words "$tmp/corpus.txt" 6000

if [ "$mode" = gpt ]; then
    run "$clgrad" train "$src/models/gpt-mini.cfg" --data "text:$tmp/corpus.txt" --steps 2 --batch 2 --no-eval --quiet
    if printf '%s\n' "$out" | grep -q "unknown section type"; then
        echo "SKIP: gpt-mini uses a layer type this build lacks: $(printf '%s\n' "$out" | tail -1)"
        exit 77
    fi
    # 6000 bytes hold a window of 129 bytes in the head and in the tail
    check 0 "trained" "gpt-mini trains 2 steps on text" -- \
        "$clgrad" train "$src/models/gpt-mini.cfg" --data "text:$tmp/corpus.txt" --steps 2 --batch 2 \
        --save "$tmp/g.safetensors"
    check 0 "bits per byte" "gpt-mini eval on text" -- \
        "$clgrad" eval "$src/models/gpt-mini.cfg" --weights "$tmp/g.safetensors" --data "text:$tmp/corpus.txt" --batch 2
    [ "$fails" -eq 0 ] && { echo "ok: $n checks"; exit 0; }
    echo "$fails of $n checks failed"; exit 1
fi

# a token model: [net] input = tokens (16 byte ids) into an [embedding], a target per position
cat > "$tmp/tok.cfg" <<'CFG'
[net]
channels = 1
height = 16
width = 1
input = tokens
classes = 256
batch = 8
optimizer = adamw
learning_rate = 0.001
weight_decay = 0.1
decay_matrices_only = 1
schedule = cosine
warmup = 5
clip_norm = 0.05
[embedding]
name = emb
vocab = 256
dim = 16
[dense]
name = fc
units = 256
[softmax]
CFG
sed 's/classes = 256/classes = 10/; s/units = 256/units = 10/' "$tmp/tok.cfg" > "$tmp/tok10.cfg"
: > "$tmp/empty.txt"
head -c 169 "$tmp/corpus.txt" > "$tmp/short.txt"
mkdir "$tmp/dir"

# straight: 2 epochs (head 5400 bytes / 16 = 337 windows, 43 steps each), on 2 devices, clipping on every step
# (clip_norm 0.05 is below the gradient norm throughout; with 1.0 it stops biting and the check went blind).
# The resumed run below must equal it bitwise whatever clgrad measures in each process: the split is fixed
# (--split even; a checkpoint carries the shares otherwise), the lanes' gradient sum path is left to
# dp_reduce = auto here, and the interrupted run sums on the host, its resumption device-to-device (the two
# paths give the same gradient norm to the bit, so the same clipped update), the GEMM backend is auto (a
# measured choice is kept in the tuning database for the next process).
unset CLGRAD_DP_REDUCE CLGRAD_GEMM_BACKEND
check 0 "bits per byte" "train a token model on text" -- \
    "$clgrad" train "$tmp/tok.cfg" --data "text:$tmp/corpus.txt" --epochs 2 --seed 5 --split even --save "$tmp/a.safetensors"
check 0 "tok/s" "progress in tokens/s" -- \
    "$clgrad" train "$tmp/tok.cfg" --data "text:$tmp/corpus.txt" --epochs 1 --steps 1 --seed 5
check 0 "steps in [0-9.]* s ([0-9]* tokens/s)" "the final summary in tokens/s" -- \
    "$clgrad" train "$tmp/tok.cfg" --data "text:$tmp/corpus.txt" --epochs 1 --steps 1 --seed 5 --quiet
check 0 "the last 600 held out" "the set-up names the held-out tail" -- \
    "$clgrad" train "$tmp/tok.cfg" --data "text:$tmp/corpus.txt" --epochs 1 --steps 1 --seed 5
# interrupted mid-epoch 1 and resumed (below): the same windows, bitwise the same weights
check 0 "" "train until step 50 with a checkpoint (host reduction)" -- \
    env CLGRAD_DP_REDUCE=host \
    "$clgrad" train "$tmp/tok.cfg" --data "text:$tmp/corpus.txt" --epochs 2 --seed 5 --split even --checkpoint "$tmp/ck" --steps 50
check 0 "bits per byte" "resume to the end (device-to-device reduction)" -- \
    env CLGRAD_DP_REDUCE=device \
    "$clgrad" train "$tmp/tok.cfg" --data "text:$tmp/corpus.txt" --epochs 2 --seed 5 --split even --checkpoint "$tmp/ck" --resume \
    --save "$tmp/b.safetensors"
n=$((n + 1))
"$py" "$src/tests/train/st_compare.py" "$tmp/a.safetensors" "$tmp/b.safetensors" 0 ||
    { echo "FAIL: the resumed run's weights differ from the uninterrupted run's"; fails=$((fails + 1)); }
check 0 "bits per byte" "eval on the held-out tail" -- \
    "$clgrad" eval "$tmp/tok.cfg" --weights "$tmp/a.safetensors" --data "text:$tmp/corpus.txt"
check 0 "windows 37" "eval counts (600 - 1) / 16 held-out windows" -- \
    "$clgrad" eval "$tmp/tok.cfg" --weights "$tmp/a.safetensors" --data "text:$tmp/corpus.txt"

# refusals
check 1 "needs a model that reads token ids" "an image model with text data" -- \
    "$clgrad" train lenet5 --data "text:$tmp/corpus.txt" --quiet
check 1 "reads token ids: evaluate it on text data" "eval of a token model on images" -- \
    "$clgrad" eval "$tmp/tok.cfg" --weights "$tmp/a.safetensors" --data fashion-mnist
check 1 "reads token ids: give it text data" "a token model with an image dataset" -- \
    "$clgrad" train "$tmp/tok.cfg" --data fashion-mnist --quiet
# ids below 10 but one: in the head (offset 17), then only in the held-out tail (offset 950 of 1000)
"$py" -c 'import sys; b = bytearray([3]) * 1000; b[int(sys.argv[2])] = 200; open(sys.argv[1], "wb").write(b)' \
    "$tmp/ids_head.bin" 17
"$py" -c 'import sys; b = bytearray([3]) * 1000; b[int(sys.argv[2])] = 200; open(sys.argv[1], "wb").write(b)' \
    "$tmp/ids_tail.bin" 950
check 1 "ids_head.bin: byte 200 at offset 17 is not a token id of model .*tok10.cfg (its classes: 10)" \
    "a byte beyond the classes in the training head" -- \
    "$clgrad" train "$tmp/tok10.cfg" --data "text:$tmp/ids_head.bin" --quiet
check 1 "ids_tail.bin: byte 200 at offset 950 is not a token id" "a byte beyond the classes in the held-out tail" -- \
    "$clgrad" train "$tmp/tok10.cfg" --data "text:$tmp/ids_tail.bin" --quiet
"$py" -c 'import sys; open(sys.argv[1], "wb").write(bytes([3]) * 1000)' "$tmp/ids_ok.bin"
check 0 "bits per byte" "ids below the classes train" -- \
    "$clgrad" train "$tmp/tok10.cfg" --data "text:$tmp/ids_ok.bin" --epochs 1 --save "$tmp/w10.safetensors"
check 1 "ids_tail.bin: byte 200 at offset 950 is not a token id" "eval: a byte beyond the classes" -- \
    "$clgrad" eval "$tmp/tok10.cfg" --weights "$tmp/w10.safetensors" --data "text:$tmp/ids_tail.bin"
check 1 "empty.txt' is empty" "an empty file" -- \
    "$clgrad" train "$tmp/tok.cfg" --data "text:$tmp/empty.txt" --quiet
check 1 "short.txt' has 169 bytes.*at least 170" "a file shorter than a window in the head and the tail" -- \
    "$clgrad" train "$tmp/tok.cfg" --data "text:$tmp/short.txt" --quiet
check 1 "dir' is a directory" "a directory" -- \
    "$clgrad" train "$tmp/tok.cfg" --data "text:$tmp/dir" --quiet
check 1 "augmentation (flip, shift) is for images" "augmentation with text" -- \
    "$clgrad" train "$tmp/tok.cfg" --data "text:$tmp/corpus.txt" --augment flip --quiet
check 1 "missing.txt' does not exist" "a missing file" -- \
    "$clgrad" train "$tmp/tok.cfg" --data "text:$tmp/missing.txt" --quiet
cli_done
