#!/bin/sh
# Installs the Debian packages clgrad needs to build, test and run, when any
# is missing. Idempotent; needs root or sudo. CLGRAD_SKIP_DEPS=1 skips it.
set -e
[ "${CLGRAD_SKIP_DEPS:-0}" = 1 ] && exit 0
pkgs="build-essential pkg-config meson ninja-build python3 python3-numpy \
ocl-icd-opencl-dev opencl-headers pocl-opencl-icd clinfo oclgrind \
libclblast-dev libclfft-dev check zlib1g-dev libopenblas-dev \
openmpi-bin libopenmpi-dev dataset-fashion-mnist fortunes \
protobuf-c-compiler libprotobuf-c-dev libonnx-dev"
# fortunes: the text corpus of the GPT demo (tools/text-demo.sh).
# PyTorch (reference dumps for the layer tests, speed comparisons) is large;
# CLGRAD_NO_TORCH=1 leaves it out and those tests skip.
[ "${CLGRAD_NO_TORCH:-0}" = 1 ] || pkgs="$pkgs python3-torch"
missing=""
for p in $pkgs; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
echo "clgrad: installing missing packages:$missing"
SUDO=""
if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null 2>&1 || { echo "clgrad: need root or sudo to install:$missing" >&2; exit 1; }
    SUDO=sudo
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
# shellcheck disable=SC2086
$SUDO apt-get install -y -q --no-install-recommends $missing
