#!/bin/sh
# Soak (issue #11, deliverable 5): 2,000 LeNet-5 training steps (batch 32,
# a prediction and a weights save every 100 steps) on one device and on two
# (data parallel), printing RSS and the buffer pool's statistics every 100
# steps and judging "flat after warm-up" (tests/soak/soak.c: after the first
# 400 steps the pool creates no buffer and does not grow, RSS grows by at
# most 8 MiB). The suite runs 250 steps of each (Meson tests soak, soak-dp).
#
# usage: bench/soak.sh [BUILD_DIR] [STEPS]    (default: build 2000)
set -u
cd "$(dirname "$0")/.."
build=${1:-build}
steps=${2:-2000}
soak="$build/tests/soak/soak"
[ -x "$soak" ] || { echo "no $soak: build $build first" >&2; exit 2; }
: "${POCL_DEVICES:=pthread pthread}"
export POCL_DEVICES
rc=0
for devices in 0 0,1; do
    t0=$(date +%s)
    "$soak" "$steps" 100 models/lenet5.cfg "$devices" 8 || rc=1
    echo "# devices $devices: $(( $(date +%s) - t0 )) s"
done
exit $rc
