#!/bin/sh
# Builds the libFuzzer targets under ASan+UBSan in their own build directory
# and runs each for SECONDS, starting from the seed corpus in
# tests/fuzz/corpus/<target>/ (copied: new inputs stay in the build dir).
# usage: tests/fuzz/run.sh SECONDS [TARGET...]
#   env: FUZZ_BUILD (default build-fuzz), FUZZ_JOBS (ninja -j, default 2)
# Prints "fuzz <target>: N executions, 0 crashes" per target and a total.
# Exit 0 all clean, 1 a target crashed/leaked/timed out (its reproducer is
# named), 2 usage or build error, 77 clang/libFuzzer absent (skipped).
set -u
secs=${1:-}
case "$secs" in ''|*[!0-9]*) echo "usage: $0 SECONDS [TARGET...]" >&2; exit 2 ;; esac
shift
root=$(cd "$(dirname "$0")/../.." && pwd)
bdir=${FUZZ_BUILD:-$root/build-fuzz}
all="model checkpoint idx cifar pgm tune convalgos progcache select onnx"
targets=${*:-$all}

# skip only when the toolchain is really absent
if ! command -v clang >/dev/null 2>&1; then
    echo "fuzz: skipped: clang not installed (Debian: apt-get install clang libclang-rt-14-dev)"; exit 77
fi
probe=$(mktemp -d) || exit 2
printf '#include <stddef.h>\n#include <stdint.h>\nint LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { return 0; }\n' \
    > "$probe/p.c"
if ! clang -fsanitize=fuzzer,address,undefined "$probe/p.c" -o "$probe/p" >/dev/null 2>&1; then
    rm -rf "$probe"
    echo "fuzz: skipped: clang cannot link libFuzzer (Debian: apt-get install libclang-rt-14-dev)"; exit 77
fi
rm -rf "$probe"

t0=$(date +%s)
if [ ! -f "$bdir/build.ninja" ]; then
    CC=clang meson setup "$bdir" "$root" --buildtype=debugoptimized -Dfuzz=enabled -Dtests=disabled \
        -Db_sanitize=address,undefined -Db_lundef=false -Dclblast=disabled -Dclfft=disabled -Dmpi=disabled \
        >"${TMPDIR:-/tmp}/clgrad-fuzz-setup.log" 2>&1 ||
        { tail -30 "${TMPDIR:-/tmp}/clgrad-fuzz-setup.log"; exit 2; }
fi
# onnx exists only where protobuf-c and libonnx-dev were found at setup
if ! ninja -C "$bdir" -t targets all 2>/dev/null | grep -q '^tests/fuzz/fuzz_onnx:'; then
    case " $targets " in *" onnx "*)
        echo "fuzz onnx: skipped (built without ONNX support: protobuf-c / libonnx-dev missing)"
        targets=$(echo " $targets " | sed 's/ onnx / /') ;;
    esac
fi
exes=""
for t in $targets; do exes="$exes tests/fuzz/fuzz_$t"; done
# shellcheck disable=SC2086
ninja -C "$bdir" -j "${FUZZ_JOBS:-2}" $exes >"$bdir/fuzz-build.log" 2>&1 || { tail -30 "$bdir/fuzz-build.log"; exit 2; }
echo "fuzz: built $(echo $targets | wc -w) targets in $(( $(date +%s) - t0 )) s"

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:allocator_may_return_null=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
export TMPDIR=${TMPDIR:-/tmp}
fails=0; total=0
for t in $targets; do
    work="$bdir/fuzz-work/$t"; art="$bdir/fuzz-artifacts/$t/"
    mkdir -p "$work" "$art"
    cp "$root/tests/fuzz/corpus/$t/"* "$work/" 2>/dev/null
    log="$bdir/fuzz-$t.log"
    "$bdir/tests/fuzz/fuzz_$t" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
        -print_final_stats=1 -error_exitcode=1 -artifact_prefix="$art" "$work" >"$log" 2>&1
    rc=$?
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    execs=${execs:-0}
    total=$((total + execs))
    if [ "$rc" -ne 0 ]; then
        fails=$((fails + 1))
        echo "fuzz $t: FAILED (exit $rc) after $execs executions; reproducer in $art, log $log:"
        grep -E "ERROR|SUMMARY|runtime error|Test unit written" "$log" | head -8
    else
        echo "fuzz $t: $execs executions, 0 crashes"
    fi
done
echo "fuzz: $total executions in total, $fails of $(echo $targets | wc -w) targets failed"
[ "$fails" -eq 0 ] || exit 1
