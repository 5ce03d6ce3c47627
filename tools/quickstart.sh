#!/bin/sh
# The two README commands.
#   tools/quickstart.sh demo   install deps, build, list devices, self-check,
#                              train the demo model on Fashion-MNIST
#   tools/quickstart.sh cifar10 build, then train ResNet-20 on CIFAR-10 (the
#                              binary batches in $CLGRAD_DATA_DIR or
#                              /usr/share/datasets; EPOCHS, default 3)
#   tools/quickstart.sh test   install deps, build, run the whole test suite
# BUILD_DIR (default: build) picks the build directory.
set -e
cd "$(dirname "$0")/.."
mode="${1:-demo}"
build="${BUILD_DIR:-build}"
sh tools/setup-deps.sh
if [ -f "$build/build.ninja" ]; then
    meson setup --reconfigure "$build" >/dev/null
else
    meson setup "$build" --buildtype=release
fi
ninja -C "$build"
export POCL_DEVICES="${POCL_DEVICES:-pthread pthread}"
case "$mode" in
demo)
    "$build/tools/clgrad" devices
    "$build/tools/clgrad" selfcheck
    if "$build/tools/clgrad" train --help >/dev/null 2>&1; then
        "$build/tools/clgrad" train models/lenet5.cfg --data fashion-mnist --epochs 3 --devices 0
    fi
    ;;
cifar10)
    "$build/tools/clgrad" train models/resnet20.cfg --data cifar10 --epochs "${EPOCHS:-3}" --devices 0
    ;;
test)
    set +e
    meson test -C "$build" --print-errorlogs --num-processes 2
    rc=$?
    python3 - "$build/meson-logs/testlog.json" <<'PY'
import json, sys
res = [json.loads(l)["result"] for l in open(sys.argv[1]) if l.strip()]
ok = sum(r in ("OK", "EXPECTEDFAIL") for r in res)
skip = sum(r == "SKIP" for r in res)
print("%d passed, %d failed, %d skipped" % (ok, len(res) - ok - skip, skip))
PY
    exit $rc
    ;;
*)
    echo "usage: tools/quickstart.sh demo|cifar10|test" >&2
    exit 2
    ;;
esac
