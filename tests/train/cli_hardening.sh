#!/bin/sh
# Hostile command lines and files (issue #11): non-finite or unknown option
# values are usage errors (2) naming the option; model files with NUL bytes,
# directories, FIFOs, empty input entries, dead branches and gzipped PGMs
# fail (1) with a message naming the file and the problem; nothing blocks.
# usage: cli_hardening.sh PATH/TO/clgrad PYTHON
clgrad="$1"; py="$2"
. "$(dirname "$0")/cli_common.sh"
cli_setup cli-hard
# 4x4 images, 2 classes (bright left or right half), fresh noise each run
make_idx "$tmp/data" 4 64 16
net='[net]
channels = 1
height = 4
width = 4
classes = 2
batch = 8'
printf '%s\n[dense]\nname = fc1\nunits = 2\n[softmax]\n' "$net" > "$tmp/ok.cfg"
cl() { timeout 60 "$clgrad" "$@"; } # a blocked open fails the check instead of the suite
train() { cl train "$@" --data "$tmp/data" --epochs 1 --seed 5; }
check 0 "test loss" "a good model trains" -- train "$tmp/ok.cfg"

# Defect 5: non-finite and unknown option values
for opt in --lr --momentum --weight-decay --clip-norm; do
    for v in nan inf -inf NaN; do
        check 2 "option $opt wants a finite number" "$opt $v" -- train "$tmp/ok.cfg" "$opt" "$v"
    done
done
check 2 "option --gemm-backend wants one of auto, own, clblast" "unknown --gemm-backend" -- \
    train "$tmp/ok.cfg" --gemm-backend bogus
check 0 "test loss" "--gemm-backend own" -- train "$tmp/ok.cfg" --gemm-backend own

# Defect 7: a NUL byte in a model file, at a random offset past the text
{ cat "$tmp/ok.cfg"; printf '\000[dense]\nunits = 9\n'; } > "$tmp/nul.cfg"
off=$(wc -c < "$tmp/ok.cfg")
check 1 "nul.cfg:offset $off: NUL byte" "train: NUL byte" -- train "$tmp/nul.cfg"
check 1 "nul.cfg:offset $off: NUL byte" "bench train: NUL byte" -- cl bench train --model "$tmp/nul.cfg" --steps 1
"$clgrad" train "$tmp/ok.cfg" --data "$tmp/data" --epochs 1 --save "$tmp/w.safetensors" >/dev/null 2>&1
check 1 "nul.cfg:offset $off: NUL byte" "eval: NUL byte" -- \
    "$clgrad" eval "$tmp/nul.cfg" --weights "$tmp/w.safetensors" --data "$tmp/data"

# Defect 11: directories and FIFOs as model or weights; nothing may block
mkdir "$tmp/dir.cfg"
check 1 "dir.cfg' is a directory" "model is a directory" -- train "$tmp/dir.cfg"
check 1 "is a directory" "weights is a directory" -- \
    "$clgrad" eval "$tmp/ok.cfg" --weights "$tmp/dir.cfg" --data "$tmp/data"
if mkfifo "$tmp/fifo.cfg" 2>/dev/null; then
    check 1 "FIFO" "model is a FIFO" -- train "$tmp/fifo.cfg"
    check 1 "FIFO" "weights is a FIFO" -- cl eval "$tmp/ok.cfg" --weights "$tmp/fifo.cfg" --data "$tmp/data"
fi
# empty entries in an input list
for spec in 'fc1,' ',fc1' 'fc1,,fc1' ' , '; do
    printf '%s\n[dense]\nname = fc1\nunits = 4\n[dense]\nname = fc2\nunits = 2\ninput = %s\n[softmax]\n' \
        "$net" "$spec" > "$tmp/empty.cfg"
    check 1 "empty.cfg:.*empty entry in input list" "input = '$spec'" -- train "$tmp/empty.cfg"
done
# a dead branch: fc_dead's output feeds nothing and it is not the last layer
printf '%s\n[dense]\nname = fc1\nunits = 4\n[dense]\nname = fc_dead\nunits = 3\n[dense]\nname = fc2\nunits = 2\ninput = fc1\n[softmax]\n' \
    "$net" > "$tmp/dead.cfg"
check 1 "fc_dead.*feeds no layer" "dead branch" -- train "$tmp/dead.cfg"
# [batchnorm] after a dense layer: batch 1 has one value per channel
printf '%s\n[dense]\nname = fc1\nunits = 4\n[batchnorm]\nname = bn1\n[dense]\nname = fc2\nunits = 2\n[softmax]\n' \
    "$net" > "$tmp/bn.cfg"
check 1 "batchnorm 'bn1'.*one value per channel" "batchnorm at batch 1" -- train "$tmp/bn.cfg" --batch 1
check 0 "test loss" "batchnorm at batch 2" -- train "$tmp/bn.cfg" --batch 2
# Defect 9: checkpoint metadata edited in place (same length) or the format
# key blanked out: resume refuses it
cl train "$tmp/ok.cfg" --data "$tmp/data" --epochs 1 --checkpoint "$tmp/ck" --seed 5 >/dev/null 2>&1
edit() { # edit FROM TO OUT: first FROM (regex) in the checkpoint's header replaced, same length
    "$py" - "$tmp/ck/last.safetensors" "$1" "$2" "$3" <<'PYEOF'
import re, sys
b = open(sys.argv[1], "rb").read()
m = re.search(sys.argv[2].encode(), b)
new = sys.argv[3].encode().ljust(len(m.group(0)), b" ")
open(sys.argv[4], "wb").write(b[:m.start()] + new + b[m.end():])
PYEOF
}
edit '"norm\.std\.0":"[^"]*"' '"norm.std.0":"0"' "$tmp/std.safetensors"
check 1 "header is corrupted or edited" "checkpoint with norm.std edited" -- \
    cl eval "$tmp/ok.cfg" --weights "$tmp/std.safetensors" --data "$tmp/data"
edit ',"format":"[^"]*"' '' "$tmp/nofmt.safetensors"
check 1 "no 'format' metadata" "format key blanked out" -- \
    cl eval "$tmp/ok.cfg" --weights "$tmp/nofmt.safetensors" --data "$tmp/data"
# a gzip-compressed PGM for predict
printf 'P5\n4 4\n255\n' > "$tmp/img.pgm"
head -c 16 /dev/urandom >> "$tmp/img.pgm"
gzip -c "$tmp/img.pgm" > "$tmp/img.pgm.gz"
check 0 "class" "predict a PGM" -- cl predict "$tmp/ok.cfg" --weights "$tmp/w.safetensors" --input "$tmp/img.pgm"
check 0 "class" "predict a gzipped PGM (read like the plain one)" -- \
    "$clgrad" predict "$tmp/ok.cfg" --weights "$tmp/w.safetensors" --input "$tmp/img.pgm.gz"

echo "$n checks, $fails failed"
[ "$fails" -eq 0 ]
