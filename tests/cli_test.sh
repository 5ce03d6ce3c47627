#!/bin/sh
# CLI contract: exit codes 0 ok / 1 failure / 2 usage, --help everywhere,
# clear messages for bad input. usage: cli_test.sh PATH/TO/clgrad
clgrad="$1"
fails=0; n=0
expect() { # expect CODE DESCRIPTION -- command...
    code=$1; desc=$2; shift 3
    n=$((n + 1))
    out=$("$@" 2>&1); rc=$?
    if [ "$rc" -ne "$code" ]; then
        echo "FAIL: $desc: exit $rc, expected $code"; echo "$out" | head -5; fails=$((fails + 1))
    fi
}
expect_msg() { # expect_msg CODE PATTERN DESCRIPTION -- command...
    code=$1; pat=$2; desc=$3; shift 4
    n=$((n + 1))
    out=$("$@" 2>&1); rc=$?
    if [ "$rc" -ne "$code" ] || ! echo "$out" | grep -q -- "$pat"; then
        echo "FAIL: $desc: exit $rc (expected $code), output lacks '$pat':"; echo "$out" | head -5; fails=$((fails + 1))
    fi
}
expect 2 "no command" -- "$clgrad"
expect 0 "--help" -- "$clgrad" --help
expect 0 "--version" -- "$clgrad" --version
expect_msg 2 "unknown command" "unknown command" -- "$clgrad" frobnicate
for c in devices selfcheck train eval predict export tune; do
    expect 0 "$c --help" -- "$clgrad" $c --help
done
for b in gemm conv train start; do
    expect 0 "bench $b --help" -- "$clgrad" bench $b --help
done
expect_msg 2 "unknown option" "unknown option" -- "$clgrad" devices --bogus
expect_msg 1 "out of range" "device out of range" -- "$clgrad" devices --devices 99
expect_msg 2 "bad device selector" "bad selector" -- "$clgrad" devices --devices 0,x
expect 0 "devices" -- "$clgrad" devices
expect 0 "selfcheck" -- "$clgrad" selfcheck
# --json is valid JSON with one entry per device
n=$((n + 1))
if command -v python3 >/dev/null 2>&1; then
    if ! "$clgrad" devices --json | python3 -c 'import json,sys; d=json.load(sys.stdin); assert len(d)>=1 and all("name" in x and "compute_units" in x for x in d)'; then
        echo "FAIL: devices --json is not the expected JSON"; fails=$((fails + 1))
    fi
fi
# no OpenCL platform at all: clear message, exit 1, no crash
empty=$(mktemp -d)
expect_msg 1 "no OpenCL platform" "no-platform devices" -- env OCL_ICD_VENDORS="$empty" OCL_ICD_FILENAMES= "$clgrad" devices
expect_msg 1 "no OpenCL platform" "no-platform selfcheck" -- env OCL_ICD_VENDORS="$empty" OCL_ICD_FILENAMES= "$clgrad" selfcheck
rmdir "$empty"
echo "cli: $((n - fails)) passed, $fails failed"
[ "$fails" -eq 0 ]
