#!/bin/sh
# Saves and resumes that must be refused (issue #26): diverged but finite
# weights never replace a good checkpoint or --save file, whatever the exit
# path (--steps, --save). usage: cli_resume_guard.sh PATH/TO/clgrad PYTHON
clgrad="$1"; py="$2"
here=$(cd "$(dirname "$0")" && pwd)
. "$(dirname "$0")/cli_common.sh"
cli_setup guard
make_idx "$tmp/data" 8 96 32
cat > "$tmp/a.cfg" <<'CFG'
[net]
channels = 1
height = 8
width = 8
classes = 2
batch = 16
learning_rate = 0.05
[convolutional]
name = c1
filters = 4
size = 3
pad = 1
activation = relu
[maxpool]
size = 2
stride = 2
[dense]
name = fc1
units = 2
[softmax]
CFG
# b.cfg: the same tensors (names and shapes) with other layers; c.cfg: a.cfg
# with other comments, spacing, key order and hyper-parameters (the same model)
sed -e 's/activation = relu/activation = sigmoid/' -e 's/^\[maxpool\]/[avgpool]/' "$tmp/a.cfg" > "$tmp/b.cfg"
{ echo "# the same model, written otherwise"; sed -e 's/learning_rate = 0.05/learning_rate = 0.01/' \
    -e 's/^filters = 4$/filters=4/' -e 's/^name = c1$/pad = 1\nname = c1/' -e '/^pad = 1$/d' "$tmp/a.cfg"; } > "$tmp/c.cfg"
grep -q "^pad = 1" "$tmp/c.cfg" || { echo "c.cfg was not written as meant"; exit 1; }
train() { "$clgrad" train "$tmp/a.cfg" --data "$tmp/data" --devices 0 "$@"; }
# a good checkpoint (ck0, kept to copy from) and good weights
train --epochs 3 --steps 2 --checkpoint "$tmp/ck0" --save "$tmp/good.safetensors" >/dev/null 2>&1 ||
    { echo "the good run failed"; exit 1; }

# refused WHAT FILE CMD...: exits 1 with a "not saving" message and FILE stays byte for byte
refused() {
    what=$1; file=$2; shift 2
    n=$((n + 1))
    cp "$tmp/ck0/last.safetensors" "$file"
    out=$("$@" 2>&1); rc=$?
    echo "$what: $(printf '%s\n' "$out" | tail -1)"
    [ "$rc" -eq 1 ] || fail "$what: exit $rc (expected 1)"
    printf '%s\n' "$out" | tail -1 | grep -Eq "not saving|diverged" || fail "$what: no refusal message"
    cmp -s "$file" "$tmp/ck0/last.safetensors" || fail "$what: $file was replaced"
    ls "$(dirname "$file")" | grep -q '\.tmp\.' && fail "$what: temporary file left"
}
for lr in 1e30 1e38; do
    rm -rf "$tmp/ck"; mkdir "$tmp/ck"
    refused "--steps 3 --resume, lr $lr" "$tmp/ck/last.safetensors" \
        train --epochs 3 --lr $lr --steps 3 --checkpoint "$tmp/ck" --resume
done
refused "--steps 1 --save, lr 1e30" "$tmp/w.safetensors" train --epochs 3 --lr 1e30 --steps 1 --save "$tmp/w.safetensors"
rm -rf "$tmp/ck"; mkdir "$tmp/ck"
refused "--steps 3 --checkpoint (no resume), lr 1e30" "$tmp/ck/last.safetensors" \
    train --epochs 3 --lr 1e30 --steps 3 --checkpoint "$tmp/ck"
refused "--limit-train 40 (last partial epoch) --save, lr 1e30" "$tmp/w.safetensors" \
    train --epochs 1 --lr 1e30 --limit-train 40 --save "$tmp/w.safetensors"

# resume_refused WHAT KEY=VALUE...: a resume from ck0 with these metadata edits (header re-signed) is refused
# naming the first key, and the checkpoint stays as it was
resume_refused() {
    what=$1; key=${2%%=*}
    n=$((n + 1))
    rm -rf "$tmp/ck"; mkdir "$tmp/ck"
    shift
    "$py" "$here/forge_ckpt.py" "$tmp/ck0/last.safetensors" "$tmp/ck/last.safetensors" "$@" || { fail "$what: forge"; return; }
    cp "$tmp/ck/last.safetensors" "$tmp/forged"
    out=$(train --epochs 3 --checkpoint "$tmp/ck" --resume 2>&1); rc=$?
    msg=$(printf '%s\n' "$out" | tail -1)
    echo "$what: $msg"
    [ "$rc" -ne 0 ] || fail "$what: exit 0"
    printf '%s\n' "$msg" | grep -qF "'$key'" || fail "$what: the message does not name '$key'"
    cmp -s "$tmp/ck/last.safetensors" "$tmp/forged" || fail "$what: the checkpoint was replaced"
}
# the forger itself: a re-signed checkpoint with nothing changed resumes
rm -rf "$tmp/ck"; mkdir "$tmp/ck"; n=$((n + 1))
"$py" "$here/forge_ckpt.py" "$tmp/ck0/last.safetensors" "$tmp/ck/last.safetensors" &&
    train --epochs 3 --checkpoint "$tmp/ck" --resume >/dev/null 2>&1 || fail "a re-signed, unchanged checkpoint does not resume"
resume_refused "norm.channels 0" norm.channels=0
resume_refused "norm.channels missing" norm.channels=
resume_refused "optimizer.lr nan" optimizer.lr=nan
resume_refused "optimizer.momentum 1" optimizer.momentum=1
resume_refused "rng not hex" rng=zz:yy
resume_refused "rng of another epoch" "rng=0000000000000001:0000000000000003"
resume_refused "seed -1" seed=-1
resume_refused "total_steps -1" total_steps=-1
resume_refused "total_steps missing" total_steps=
resume_refused "total_steps 1, below step 2" total_steps=1
resume_refused "epoch 1000000 (no rng key)" epoch=1000000 rng=
resume_refused "batch 0" batch=0

# item 7: another model with the same tensor shapes, or an edited model text, is refused naming both hashes
model_refused() {
    what=$1; cfg=$2; shift 2
    n=$((n + 1))
    rm -rf "$tmp/ck"; mkdir "$tmp/ck"
    "$py" "$here/forge_ckpt.py" "$tmp/ck0/last.safetensors" "$tmp/ck/last.safetensors" "$@" || { fail "$what: forge"; return; }
    cp "$tmp/ck/last.safetensors" "$tmp/forged"
    out=$("$clgrad" train "$tmp/$cfg" --data "$tmp/data" --devices 0 --epochs 3 --checkpoint "$tmp/ck" --resume 2>&1)
    rc=$?
    msg=$(printf '%s\n' "$out" | tail -1)
    echo "$what: $msg"
    [ "$rc" -ne 0 ] || fail "$what: exit 0"
    [ "$(printf '%s\n' "$msg" | grep -oE '\b[0-9a-f]{16}\b' | sort -u | wc -l)" -ge 2 ] || fail "$what: two hashes not named"
    cmp -s "$tmp/ck/last.safetensors" "$tmp/forged" || fail "$what: the checkpoint was replaced"
}
model_refused "sigmoid + avgpool instead of relu + maxpool" b.cfg
model_refused "stored model text replaced" a.cfg "model=$(cat "$tmp/b.cfg")"
model_refused "stored model text replaced, no model.hash" a.cfg "model=$(cat "$tmp/b.cfg")" model.hash=
# the same model written otherwise resumes; an old checkpoint without model.hash resumes with a note
n=$((n + 1))
rm -rf "$tmp/ck"; cp -r "$tmp/ck0" "$tmp/ck"
"$clgrad" train "$tmp/c.cfg" --data "$tmp/data" --devices 0 --epochs 3 --steps 3 --checkpoint "$tmp/ck" --resume \
    >/dev/null 2>"$tmp/err" || fail "the same model written otherwise does not resume: $(tail -1 "$tmp/err")"
n=$((n + 1))
rm -rf "$tmp/ck"; mkdir "$tmp/ck"
"$py" "$here/forge_ckpt.py" "$tmp/ck0/last.safetensors" "$tmp/ck/last.safetensors" model.hash=
train --epochs 3 --steps 3 --checkpoint "$tmp/ck" --resume >/dev/null 2>"$tmp/err" ||
    fail "a checkpoint without model.hash does not resume: $(tail -1 "$tmp/err")"
grep -q "no model.hash" "$tmp/err" || fail "no note for a checkpoint without model.hash"
# --resume-weights-only: the other model takes the weights, from step 0
n=$((n + 1))
rm -rf "$tmp/ck"; cp -r "$tmp/ck0" "$tmp/ck"
out=$("$clgrad" train "$tmp/b.cfg" --data "$tmp/data" --devices 0 --epochs 1 --steps 1 --checkpoint "$tmp/ck" \
    --resume-weights-only 2>&1) || fail "--resume-weights-only: $(printf '%s\n' "$out" | tail -1)"
printf '%s\n' "$out" | grep -q "1 steps" || fail "--resume-weights-only did not start from step 0: $(printf '%s\n' "$out" | grep steps)"

# a temporary file left by a save killed before its rename: removed, and said on stderr naming it
n=$((n + 1))
rm -rf "$tmp/ck"; cp -r "$tmp/ck0" "$tmp/ck"
head -c 1000 "$tmp/ck0/last.safetensors" > "$tmp/ck/last.safetensors.tmp.Ab12Cd"
touch -d '1 hour ago' "$tmp/ck/last.safetensors.tmp.Ab12Cd"
train --epochs 3 --steps 3 --checkpoint "$tmp/ck" --resume --quiet >/dev/null 2>"$tmp/err" ||
    fail "resume beside a stale temporary file: $(tail -1 "$tmp/err")"
[ ! -e "$tmp/ck/last.safetensors.tmp.Ab12Cd" ] || fail "the stale temporary file was not removed"
[ "$(grep -c 'last.safetensors.tmp.Ab12Cd' "$tmp/err")" -eq 1 ] || fail "no (single) line naming the removed file"

echo "$n checks, $fails failed"
[ "$fails" -eq 0 ]
