#!/bin/sh
# The GPU bundle (tools/device-bundle.sh) on a clean environment: builds it
# from this build, checks it stays under 64 MiB and that every binary in it
# resolves its libraries from the bundle, then runs bench/device-check.sh
# --smoke under `env -i` with only PATH=/usr/bin:/bin, HOME (caches) and
# POCL_DEVICES: no LD_LIBRARY_PATH, no registered ICD file (--no-system-icd),
# so PoCL must be found by the driver search and loaded through the
# generated ICD folder. The results folder must hold the steps' logs and a
# summary with every step ok.
# usage: bundle_test.sh BUILD_DIR SOURCE_DIR
build="$1"; src="$2"
tmp=$(mktemp -d /tmp/clgrad-bundle-XXXXXX) || exit 1
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
command -v ldd >/dev/null 2>&1 || { echo "skip: no ldd"; exit 77; }
have=0
for f in /usr/lib/x86_64-linux-gnu/libpocl.so* /usr/lib64/libpocl.so* /usr/lib/libpocl.so*; do
    [ -e "$f" ] && have=1
done
[ $have = 1 ] || { echo "skip: no PoCL library in the searched directories"; exit 77; }
t0=$(date +%s)
CLGRAD_BUNDLE_CUBLAS=0 sh "$src/tools/device-bundle.sh" "$build" "$tmp/bundle" || fail "device-bundle.sh"
size=$(du -sb "$tmp/bundle" | cut -f1)
[ "$size" -lt $((64 * 1024 * 1024)) ] || fail "bundle is $size bytes"
for f in "$tmp/bundle/lib/libclgrad.so.1" "$tmp/bundle/lib/libOpenCL.so.1" "$tmp/bundle/bin/clgrad.real" \
         "$tmp/bundle/models/resnet20.cfg" "$tmp/bundle/device-check.sh" "$tmp/bundle/tests/test_core"; do
    [ -e "$f" ] || fail "bundle lacks $f"
done
# every binary resolves every library with only the bundle's lib folder
for b in "$tmp/bundle/bin/clgrad.real" "$tmp/bundle"/tests/*; do
    out=$(env -i LD_LIBRARY_PATH="$tmp/bundle/lib:$tmp/bundle/lib/fallback" ldd "$b" 2>&1)
    echo "$out" | grep -q "not found" && fail "$b: $(echo "$out" | grep 'not found')"
    echo "$out" | grep -q "libclgrad" && ! echo "$out" | grep -q "$tmp/bundle/lib/libclgrad" &&
        fail "$b loads libclgrad from outside the bundle"
done
t1=$(date +%s)
env -i PATH=/usr/bin:/bin HOME="${HOME:-$tmp}" POCL_DEVICES="${POCL_DEVICES:-pthread}" \
    CLGRAD_CACHE_DIR="${CLGRAD_CACHE_DIR:-$tmp/cache}" \
    sh "$tmp/bundle/device-check.sh" --smoke --no-system-icd "$tmp/results"
rc=$?
t2=$(date +%s)
[ $rc = 0 ] || { tail -n 20 "$tmp/results"/*.log; fail "device-check --smoke exit $rc"; }
grep -q "libpocl" "$tmp/results/icd/"*.icd || fail "no generated ICD file names PoCL"
ls "$tmp/results/icd" | grep -q "^system-" && fail "--no-system-icd still copied a registered ICD file"
for s in devices selfcheck gemm train-lenet5; do
    grep -q "^ok    $s " "$tmp/results/summary.txt" || fail "step $s not ok: $(cat "$tmp/results/summary.txt")"
done
grep -q "self-check passed" "$tmp/results/selfcheck.log" || fail "selfcheck log"
echo "bundle $((size / 1024)) KiB built in $((t1 - t0)) s; device-check --smoke in $((t2 - t1)) s"
