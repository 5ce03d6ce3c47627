#!/bin/sh
# One training step of every shipped model (full size) under oclgrind posing
# as two GPU classes, with its race / uninitialised-value / API checks:
#   nv  - NVIDIA-like: 48 KiB local memory, 1024 work-items per group
#   amd - AMD/Intel-like: 32 KiB local memory, 256 work-items per group
# Not part of the test suite (minutes per model); the suite runs narrow
# copies (tests/portability). Prints one Markdown table row per run:
# profile, model, precision, result, oclgrind reports (per kernel), seconds.
#
# usage: bench/oclgrind_profiles.sh [BUILD_DIR]   (default: build)
# MODELS="models/lenet5.cfg ..." PROFILES="nv amd" PRECISIONS="fp32 fp16"
# BATCH=2 pick the runs; LOGDIR keeps the oclgrind logs (default: a temp dir).
# CLGRAD_CONV_AUTO_MEASURE=0 (default here) takes the untuned algorithm
# choices; =1 measures every candidate, 4 runs each, which multiplies the
# time and runs clFFT's kernels (they stop oclgrind: "Unsupported
# instruction: freeze").
set -u
cd "$(dirname "$0")/.."
build=${1:-build}
clgrad="$build/tools/clgrad"
shim="$build/tests/liboclgrind_fill_shim.so"
[ -x "$clgrad" ] || { echo "build clgrad first: $clgrad" >&2; exit 2; }
command -v oclgrind >/dev/null 2>&1 || { echo "oclgrind is not installed" >&2; exit 77; }
models=${MODELS:-$(ls models/*.cfg)}
profiles=${PROFILES:-nv amd}
precisions=${PRECISIONS:-fp32 fp16}
batch=${BATCH:-2}
logdir=${LOGDIR:-$(mktemp -d)}
mkdir -p "$logdir"
export CLGRAD_CONV_AUTO_MEASURE=${CLGRAD_CONV_AUTO_MEASURE:-0} CLGRAD_GEMM_AUTO_MEASURE=0
[ -f "$shim" ] && export CLGRAD_OCLGRIND_SHIM="$PWD/$shim"

echo "| profile | model | precision | result | oclgrind reports | seconds |"
echo "|---|---|---|---|---|---:|"
fail=0
for prof in $profiles; do
    case $prof in
    nv) lmem=49152 wg=1024 ;;
    amd) lmem=32768 wg=256 ;;
    *) echo "unknown profile $prof (nv, amd)" >&2; exit 2 ;;
    esac
    for m in $models; do
        for prec in $precisions; do
            name=$(basename "$m" .cfg)
            log="$logdir/$prof-$name-$prec.log"
            t0=$(date +%s)
            OCLGRIND_LOCAL_MEM_SIZE=$lmem OCLGRIND_MAX_WGSIZE=$wg OCLGRIND_COMPUTE_UNITS=4 \
                OCLGRIND_CHECK_LOG="$log" nice -n 10 sh tests/oclgrind_check.sh "$clgrad" bench train \
                --model "$m" --batch "$batch" --steps 1 --warmup 0 --precision "$prec" >"$log.out" 2>&1
            rc=$?
            t1=$(date +%s)
            reports=$(grep 'Kernel:' "$log" 2>/dev/null | sed 's/.*Kernel: //' | sort | uniq -c |
                awk '{printf "%s%s %s", sep, $1, $2; sep=", "}')
            if [ "$rc" -eq 0 ]; then
                res=ok
            else
                fail=1
                res="failed: $(grep -m1 -E '^error|failed|exceeds' "$log.out" | cut -c1-120)"
            fi
            echo "| $prof | $name | $prec | $res | ${reports:-none} | $((t1 - t0)) |"
        done
    done
done
echo "logs: $logdir" >&2
exit $fail
