#!/bin/sh
# Numerical faults (issue #11, deliverable 3): a run that diverges fails at
# the step it happens with a message naming the step and the first layer
# whose output or gradient went non-finite, on one device and on two, and
# the good checkpoint it resumed from stays as it was (nothing non-finite is
# written). usage: cli_nonfinite.sh PATH/TO/clgrad PYTHON
clgrad="$1"; py="$2"
. "$(dirname "$0")/cli_common.sh"
cli_setup nonfinite
# synthetic 8x8 data, 4 classes (bright quadrant k = class k)
make_idx "$tmp/data" 8 256 64 --quadrants
make_mlp "$tmp/mlp.cfg"
cat > "$tmp/bn.cfg" <<'CFG'
[net]
channels = 1
height = 8
width = 8
classes = 4
batch = 32
learning_rate = 0.1
[convolutional]
name = c1
filters = 4
size = 3
pad = 1
activation = linear
[batchnorm]
name = bn1
sync = 1
[dense]
name = fc1
units = 4
[softmax]
CFG
model=mlp.cfg
# diverge WHAT ARGS...: a good checkpoint of $model first, then a resumed run at lr 1e30
diverge() {
    what=$1; shift
    rm -rf "$tmp/ck" "$tmp/w.safetensors"
    n=$((n + 1))
    "$clgrad" train "$tmp/$model" --data "$tmp/data" --epochs 1 --checkpoint "$tmp/ck" "$@" >/dev/null 2>&1 ||
        { fail "$what: the good run failed"; return; }
    sum0=$(cksum < "$tmp/ck/last.safetensors")
    out=$("$clgrad" train "$tmp/$model" --data "$tmp/data" --epochs 3 --lr 1e30 --checkpoint "$tmp/ck" --resume \
        --save "$tmp/w.safetensors" "$@" 2>&1)
    rc=$?
    msg=$(printf '%s\n' "$out" | tail -1)
    echo "$what: $msg"
    [ "$rc" -eq 1 ] || fail "$what: exit $rc (expected 1)"
    printf '%s\n' "$msg" | grep -Eq "(diverged at step|not finite at step) [0-9]+" || fail "$what: no step named"
    printf '%s\n' "$msg" | grep -Eq "first non-finite value in (forward|backward): layer '(c1|bn1|fc1|fc2|softmax[0-9])' \((convolutional|batchnorm|dense|softmax), [^)]*$model:[0-9]+\)" ||
        fail "$what: no layer named"
    [ "$(cksum < "$tmp/ck/last.safetensors")" = "$sum0" ] || fail "$what: the good checkpoint was replaced"
    [ ! -e "$tmp/w.safetensors" ] || fail "$what: diverged weights saved"
    ls "$tmp/ck" | grep -q tmp && fail "$what: temporary file left"
    "$clgrad" eval "$tmp/$model" --weights "$tmp/ck/last.safetensors" --data "$tmp/data" >"$tmp/eval.txt" 2>&1 ||
        fail "$what: the checkpoint no longer evaluates: $(tail -1 "$tmp/eval.txt")"
    grep -Eqi "nan|inf" "$tmp/eval.txt" && fail "$what: non-finite evaluation: $(cat "$tmp/eval.txt")"
}
diverge "one device" --devices 0
if "$clgrad" devices 2>/dev/null | grep -q "^device 1:"; then
    diverge "two devices" --devices 0,1
    model=bn.cfg # synchronized batch norm: the check runs on lane 0 alone, and must not wait for the others
    diverge "two devices, [batchnorm] sync = 1" --devices 0,1
    model=mlp.cfg
else
    echo "one device only: the two-device case is not run" >&2
fi
diverge "fp16, one device" --devices 0 --precision fp16
echo "$n checks, $fails failed"
[ "$fails" -eq 0 ]
