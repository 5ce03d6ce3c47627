#!/bin/sh
# The CLI's option tables: a shared option is validated the same way by every
# command that takes it; numbers are plain decimal within the stated range;
# every usage error names the option (exit 2); --help lists the options.
# usage: cli_options.sh PATH/TO/clgrad
clgrad="$1"
fails=0; n=0
check() { # check CODE PATTERN DESCRIPTION -- command...
    code=$1; pat=$2; desc=$3; shift 4
    n=$((n + 1))
    out=$("$clgrad" "$@" 2>&1); rc=$?
    if [ "$rc" -ne "$code" ] || ! printf '%s\n' "$out" | grep -q -- "$pat"; then
        echo "FAIL: $desc: exit $rc (expected $code), output lacks '$pat':"; printf '%s\n' "$out" | head -4
        fails=$((fails + 1))
    fi
}
batch_msg="option --batch wants an integer in \[1, 1048576\]"
for cmd in "train lenet5" "eval lenet5" "precompile lenet5" "bench train --model lenet5" \
    "bench start --model lenet5" "bench gemm"; do
    for v in 0 1048577 0x10 " 8" "8 " 8x +8 -1 "" 1e3; do
        check 2 "$batch_msg" "$cmd --batch '$v'" -- $cmd --batch "$v"
    done
    check 2 "$batch_msg" "$cmd --batch=0x10" -- $cmd --batch=0x10
    check 2 "option --batch needs a value" "$cmd --batch at the end" -- $cmd --batch
done
for cmd in "train lenet5" "precompile lenet5" "bench train --model lenet5"; do
    for v in fp8 FP16 ""; do
        check 2 "option --precision wants one of fp32, fp16; got '$v'" "$cmd --precision '$v'" -- $cmd --precision "$v"
    done
done
for cmd in "train lenet5" "bench train --model lenet5" "bench prim"; do
    check 2 "option --gemm-backend wants one of auto, own, clblast" "$cmd --gemm-backend ref" -- $cmd --gemm-backend ref
done
for v in 0x1p3 " 1" "1 " 1e 1e+ . -.5 inf nan 1,5; do
    check 2 "option --lr wants a finite number" "train --lr '$v'" -- train lenet5 --lr "$v"
done
for cmd in "train lenet5" "bench train --model lenet5"; do
    check 2 "option --bucket-mb wants a finite number in (0, 65536\]" "$cmd --bucket-mb 0" -- $cmd --bucket-mb 0
    check 2 "option --comm-timeout wants a finite number in (0, 86400\]" "$cmd --comm-timeout 0" -- $cmd --comm-timeout 0
    check 2 "option --split wants auto, even, or weights" "$cmd --split 3,,1" -- $cmd --split 3,,1
done
# issue 26 items 4, 5: an empty or malformed device selector, split weights that are not plain decimal in
# [0, 1e6] within a ratio of 1e6, and numbers in hex are usage errors naming the option
for cmd in devices selfcheck "train lenet5" "eval lenet5" "bench train --model lenet5" "bench gemm" "bench prim"; do
    for v in "" 0, ,0 0,,1 ,; do
        check 2 "option --devices wants a comma-separated list" "$cmd --devices '$v'" -- $cmd --devices "$v"
    done
done
for cmd in "train lenet5" "bench train --model lenet5"; do
    for v in 1e308,1e308 " 1, 1" "1, 1" +1,1 0x10,1 inf,1 nan,1 1,-1 1e7,1 1,1e-7 0,0 -1; do
        check 2 "option --split wants auto, even, or weights" "$cmd --split '$v'" -- $cmd --split "$v"
    done
    check 2 "option --bucket-mb wants a finite number in (0, 65536\]" "$cmd --bucket-mb 0x10" -- $cmd --bucket-mb 0x10
done
for v in "" 0, ,0 0,,1 name:; do
    n=$((n + 1))
    out=$(CLGRAD_DEVICES="$v" "$clgrad" eval lenet5 --data /nonexistent 2>&1); rc=$?
    if [ "$rc" -ne 2 ] || ! printf '%s\n' "$out" | grep -q -e selector -e 'CLGRAD_DEVICES.* is empty'; then
        echo "FAIL: CLGRAD_DEVICES='$v': exit $rc (expected 2), output lacks 'selector':"; printf '%s\n' "$out" | head -4
        fails=$((fails + 1))
    fi
done
check 2 "option --momentum wants a finite number in \[0, 1)" "momentum 1" -- train lenet5 --momentum 1
check 2 "option --json takes no value" "flag with a value" -- devices --json=1
check 2 "option --devices needs a value" "devices without a value" -- selfcheck --devices
check 2 "unknown option '--batchsize'" "a longer name is not a prefix match" -- bench train --batchsize 8
check 2 "unexpected argument 'extra'" "positional where none is taken" -- bench gemm extra
check 2 "option --order wants one of forward, reverse" "precompile --order" -- precompile lenet5 --order sideways
# accepted spellings reach the library: a missing dataset is a failure (1), not a usage error
check 1 "nowhere" "train accepts --batch=8 --lr .5 --momentum 0.9 --seed 0" -- \
    train lenet5 --data /nonexistent/nowhere --batch=8 --lr .5 --momentum 0.9 --seed 0 --epochs=1 --quiet
# --help of every command lists its options and the shared ones identically
for cmd in devices selfcheck train eval predict export tune precompile "bench gemm" "bench conv" "bench train" \
    "bench prim" "bench allreduce" "bench start"; do
    check 0 "^usage: clgrad $cmd" "$cmd --help" -- $cmd --help
done
for cmd in train eval precompile "bench train"; do
    check 0 "  --precision P \|  --batch N " "$cmd --help lists the shared options" -- $cmd --help
done
dev_line=$("$clgrad" train --help | grep -- "--devices SEL")
for cmd in devices selfcheck eval predict export precompile "bench conv" "bench train" "bench start"; do
    n=$((n + 1))
    if ! "$clgrad" $cmd --help | grep -qxF -- "$dev_line"; then
        echo "FAIL: $cmd --help describes --devices differently from train"; fails=$((fails + 1))
    fi
done
echo "cli-options: $((n - fails)) passed, $fails failed"
[ "$fails" -eq 0 ]
