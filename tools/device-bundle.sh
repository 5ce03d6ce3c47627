#!/bin/sh
# Packs a built clgrad into one self-contained folder for a bare machine with
# an OpenCL driver (a lent GPU machine: no package registry, little time):
#   bin/clgrad            wrapper (LD_LIBRARY_PATH=lib) around bin/clgrad.real
#   lib/                  libclgrad and every shared library the binaries load
#                         that a bare machine may lack (ICD loader, CLBlast,
#                         clFFT, protobuf-c, Open MPI, ...), found
#                         with ldd; not the C runtime (libc, libm, libpthread,
#                         libdl, librt, ld.so)
#   lib/fallback/         libstdc++ / libgcc_s: used only where the machine
#                         lacks them (a vendor driver may need a newer one)
#   tests/                the C test binaries that need neither Python nor the
#                         source tree
#   models/               the shipped models
#   device-check.sh       bench/device-check.sh: run it there
#   bench/                the PyTorch twins (train_vs_torch.py, gpt_vs_torch.py)
#   data/fortunes.txt     the demo text corpus (tools/text-demo.sh), where
#                         /usr/share/games/fortunes exists here
#   bin/cublas_probe      where nvcc is found here: cuBLAS SGEMM 2048^3
#                         (bench/cublas_probe.cu; needs CUDA's libcublas there)
#   MANIFEST              what is in here, with sizes and the build's commit
# Binaries are copied stripped. The folder must stay under 64 MiB (checked).
#
# usage: tools/device-bundle.sh [BUILD_DIR [OUT_DIR]]   (defaults: build, BUILD_DIR/device-bundle)
set -eu
src=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$src/build}" && pwd)
out=${2:-$build/device-bundle}
limit=$((64 * 1024 * 1024))
[ -x "$build/tools/clgrad" ] || { echo "device-bundle: $build/tools/clgrad not built (ninja -C $build)" >&2; exit 1; }
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib/fallback" "$out/tests" "$out/models"

strip_copy() { # strip_copy SRC DST
    cp -L "$1" "$2"
    chmod u+w "$2"
    strip --strip-unneeded "$2" 2>/dev/null || true
}

# C tests without Python or source-tree files (those with CLG_SOURCE_DIR
# compiled in read models/ or dumps from the checkout); the host-only parsers'
# tests (cfg, metrics) stay out: they say nothing about a device, and each
# test binary carries the whole library (the bundle must stay under 64 MiB)
tests="test_core test_device test_pool test_program test_api test_gemm test_gemm_packed test_gemm_splitk test_tune_family
       test_conv test_wfused test_limits test_prim test_model_layers test_model_gradcheck test_fp16
       test_nonfinite test_io_checkpoint"
bins="$build/tools/clgrad"
for t in $tests; do
    f=$(find "$build/tests" -maxdepth 2 -type f -name "$t" | head -n 1)
    [ -n "$f" ] || { echo "device-bundle: test $t not built, left out" >&2; continue; }
    if grep -q -F "$src/" "$f"; then
        echo "device-bundle: $t reads the source tree, left out" >&2
        continue
    fi
    strip_copy "$f" "$out/tests/$t"
    bins="$bins $f"
done
strip_copy "$build/tools/clgrad" "$out/bin/clgrad.real"
cat > "$out/bin/clgrad" <<'WRAP'
#!/bin/sh
# clgrad from the bundle: its libraries first (lib/fallback only where the machine lacks them)
d=$(cd "$(dirname "$0")/.." && pwd)
p="$d/lib"
for l in libstdc++.so.6 libgcc_s.so.1; do
    if ! /sbin/ldconfig -p 2>/dev/null | grep -q "$l"; then p="$p:$d/lib/fallback"; break; fi
done
LD_LIBRARY_PATH="$p${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$d/bin/clgrad.real" "$@"
WRAP
chmod +x "$out/bin/clgrad"

# shared libraries: everything ldd resolves, minus the C runtime
skip='^(libc|libm|libpthread|libdl|librt|libutil|libresolv|ld-linux-x86-64|ld-linux-aarch64|linux-vdso)\.'
fallback='^(libstdc\+\+|libgcc_s)\.'
for b in $bins; do
    ldd "$b" 2>/dev/null | awk '/=> \// {print $1, $3}'
done | sort -u | while read -r name path; do
    if echo "$name" | grep -Eq "$skip"; then continue; fi
    dest="$out/lib"
    if echo "$name" | grep -Eq "$fallback"; then dest="$out/lib/fallback"; fi
    [ -e "$dest/$name" ] || strip_copy "$path" "$dest/$name"
done
missing=$(for b in $bins; do ldd "$b" 2>/dev/null | grep "not found" || true; done | sort -u)
[ -z "$missing" ] || { echo "device-bundle: unresolved libraries:" >&2; echo "$missing" >&2; exit 1; }

cp "$src"/models/*.cfg "$src/models/README.md" "$out/models/"
cp "$src/bench/device-check.sh" "$out/device-check.sh"
# the PyTorch twins of the shipped models (device-check's peers step) and the
# demo text corpus where this machine has it (CLGRAD_BUNDLE_TEXT=0: not)
mkdir -p "$out/bench"
cp "$src/bench/train_vs_torch.py" "$src/bench/gpt_vs_torch.py" "$out/bench/"
if [ -d /usr/share/games/fortunes ] && [ "${CLGRAD_BUNDLE_TEXT:-1}" != 0 ]; then
    mkdir -p "$out/data"
    CLGRAD_DATA_DIR="$out/data" sh "$src/tools/text-demo.sh" > /dev/null
fi
cp "$src/bench/cublas_probe.cu" "$out/cublas_probe.cu"
# the cuBLAS probe, prebuilt where nvcc is here (CLGRAD_BUNDLE_CUBLAS=0: not);
# libcublas itself is not bundled (hundreds of MiB): it runs where CUDA is
nvcc=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null | head -n 1 || true)
if [ -n "$nvcc" ] && [ "${CLGRAD_BUNDLE_CUBLAS:-1}" != 0 ]; then
    "$nvcc" -O2 -o "$out/bin/cublas_probe" "$src/bench/cublas_probe.cu" -lcublas ||
        echo "device-bundle: cuBLAS probe not built (nvcc failed)" >&2
fi
chmod +x "$out/device-check.sh"

commit=$(git -C "$src" rev-parse --short HEAD 2>/dev/null || echo unknown)
size=$(du -sb "$out" | cut -f1)
{
    echo "clgrad device bundle, commit $commit, built $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m)"
    echo "total $size bytes"
    (cd "$out" && find . -type f -printf '%s %p\n' | sort -k2)
} > "$out/MANIFEST"
if [ "$size" -ge "$limit" ]; then
    echo "device-bundle: $out is $size bytes, over the 64 MiB limit" >&2
    exit 1
fi
echo "device-bundle: $out ($((size / 1024)) KiB, $(ls "$out/tests" | wc -l) tests, $(ls "$out/lib" "$out/lib/fallback" | grep -c '\.so') libraries)"
