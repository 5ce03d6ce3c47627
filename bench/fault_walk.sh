#!/bin/sh
# OpenCL fault injection, the full walk (issue #11, deliverable 2): for every
# kind of OpenCL call (tests/fault/fault_shim.c) and every N, a resumed
# LeNet-5 training run (2 steps of 8 images, evaluation, checkpoint save)
# with call N of that kind failing; each must end cleanly (exit 0 with the
# fault absorbed, or 1 with a status and message), with no hang (timeout),
# crash, sanitizer report, leaked OpenCL object, stale temporary file, and
# with the checkpoint it resumed from (or the one it wrote) still loading.
# The suite runs a sample of the same (Meson tests fault-sample: 20 s, and
# fault-sample-dp: 15 s on two devices).
#
# usage: bench/fault_walk.sh [BUILD_DIR] [DEVICES]
#   BUILD_DIR  default build-asan: an ASan+UBSan build, so LeakSanitizer
#              sees host leaks on the error paths:
#                meson setup build-asan -Db_sanitize=address,undefined -Db_lundef=false
#                ninja -C build-asan
#   DEVICES    default 0 (one device); 0,1 walks two lanes (POCL_DEVICES
#              must give two: default "pthread pthread" here)
# EVERY=K walks every K-th call of each kind (default 1: all); KINDS=a,b
# limits the kinds; LOG=FILE.jsonl keeps one line per run; COLD=1 removes the
# program binaries from each run's cache, so the faults hit the builds from
# source (e.g. KINDS=program,build,kernel COLD=1).
# Prints a line per kind and "faults tried N, ended cleanly M"; exit 0 when
# every run ended cleanly.
set -u
cd "$(dirname "$0")/.."
build=${1:-build-asan}
devices=${2:-0}
run="$build/tests/fault/fault_run"
[ -x "$run" ] || { echo "no $run: build $build first (see the top of this script)" >&2; exit 2; }
: "${POCL_DEVICES:=pthread pthread}"
export POCL_DEVICES
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:new_delete_type_mismatch=0}"
export LSAN_OPTIONS="${LSAN_OPTIONS:-suppressions=$PWD/tests/lsan.supp:print_suppressions=0}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1}"
exec /usr/bin/python3 tests/fault/walk.py --run "$run" --model models/lenet5.cfg --devices "$devices" \
    --every "${EVERY:-1}" --kinds "${KINDS:-}" --timeout 120 ${LOG:+--log "$LOG"} ${COLD:+--cold}
