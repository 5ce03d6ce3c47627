#!/bin/sh
# Installed use: `meson install --destdir` into a temporary directory, then
# from there (and from a directory outside the source tree):
#  - the headers, library, pkg-config file, shipped models and man page are
#    where they belong; the man page formats without warnings;
#  - examples/primitives.c and examples/classify.c compile against
#    `pkg-config clgrad` of the staged tree alone and run;
#  - the installed clgrad finds a shipped model by name:
#    `clgrad train lenet5 --data ...` (a few steps on a small IDX file).
# usage: install_test.sh BUILD_DIR SOURCE_DIR PREFIX LIBDIR BINDIR DATADIR MANDIR PYTHON
set -eu
build=$1 src=$2 prefix=$3 libdir=$4 bindir=$5 datadir=$6 mandir=$7 py=$8
for tool in meson pkg-config cc; do
    command -v "$tool" >/dev/null 2>&1 || { echo "skip: $tool not found" >&2; exit 77; }
done
case $libdir in /*) ;; *) libdir=$prefix/$libdir ;; esac
case $bindir in /*) ;; *) bindir=$prefix/$bindir ;; esac
case $datadir in /*) ;; *) datadir=$prefix/$datadir ;; esac
case $mandir in /*) ;; *) mandir=$prefix/$mandir ;; esac

tmp=$(mktemp -d "${TMPDIR:-/tmp}/clgrad-install.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
dest=$tmp/stage
meson install -C "$build" --destdir "$dest" --no-rebuild --quiet >"$tmp/install.log" 2>&1 ||
    { cat "$tmp/install.log"; echo "FAIL: meson install"; exit 1; }

fail() { echo "FAIL: $*"; exit 1; }
for f in "$datadir/clgrad/models/lenet5.cfg" "$datadir/clgrad/models/vgg-s.cfg" \
         "$datadir/clgrad/models/resnet-mini.cfg" "$datadir/clgrad/models/resnet20.cfg" "$mandir/man1/clgrad.1" "$bindir/clgrad" \
         "$prefix/include/clgrad.h" "$prefix/include/clgrad_prim.h" "$libdir/pkgconfig/clgrad.pc"; do
    [ -f "$dest$f" ] || fail "not installed: $f"
done
ls "$dest$libdir"/libclgrad.so.* >/dev/null 2>&1 || fail "no libclgrad.so.* in $libdir"
if command -v groff >/dev/null 2>&1; then
    warn=$(groff -man -ww -z "$dest$mandir/man1/clgrad.1" 2>&1) || fail "groff: $warn"
    [ -z "$warn" ] || fail "man page warnings: $warn"
fi

# pkg-config of the staged tree only (its prefix redefined to the stage)
export PKG_CONFIG_PATH="$dest$libdir/pkgconfig"
export PKG_CONFIG_LIBDIR="$dest$libdir/pkgconfig:$(pkg-config --variable pc_path pkg-config)"
pc="pkg-config --define-variable=prefix=$dest$prefix clgrad"
version=$($pc --modversion) || fail "pkg-config clgrad"
grep -q "#define CLG_VERSION_MINOR $(echo "$version" | cut -d. -f2)\$" "$dest$prefix/include/clgrad.h" ||
    fail "pkg-config version $version differs from the installed header"
cflags=$($pc --cflags) libs=$($pc --libs)
case "$cflags $libs" in *"$src"*|*"$build"*) fail "pkg-config points into the source or build tree: $cflags $libs" ;; esac
cd "$tmp"
# shellcheck disable=SC2086
cc -std=c11 -Wall -Wextra -Werror -o prim "$src/examples/primitives.c" $cflags $libs -lm || fail "compile primitives.c"
# shellcheck disable=SC2086
cc -std=c11 -Wall -Wextra -Werror -o classify "$src/examples/classify.c" $cflags $libs || fail "compile classify.c"
# the installed program is linked to the library and finds the staged one by its run path alone
cli_lib=$(env -u LD_LIBRARY_PATH ldd "$dest$bindir/clgrad" | sed -n 's/.*libclgrad\.so[^ ]* => \([^ ]*\).*/\1/p')
[ -n "$cli_lib" ] && [ "$(readlink -f "$cli_lib")" = "$(readlink -f "$dest$libdir"/libclgrad.so.*.*)" ] ||
    fail "the installed clgrad does not load the staged library: $(env -u LD_LIBRARY_PATH ldd "$dest$bindir/clgrad" | grep clgrad)"
export LD_LIBRARY_PATH="$dest$libdir"
# the staged library, not the build tree's
ldd ./prim | grep -q "$dest$libdir/libclgrad.so" || fail "prim does not load the staged library: $(ldd ./prim | grep clgrad)"
./prim >prim.out || { cat prim.out; fail "primitives example"; }
./classify >classify.out || { cat classify.out; fail "classify example"; }

# a shipped model by name, from a directory without models/
"$py" "$src/tests/train/make_idx.py" "$tmp/data" 28 64 16 >/dev/null 2>&1 || { echo "skip: make_idx.py failed" >&2; exit 77; }
mkdir -p "$tmp/elsewhere" && cd "$tmp/elsewhere"
CLGRAD_MODEL_DIR= "$dest$bindir/clgrad" train lenet5 --data "$tmp/data" --steps 2 --batch 8 --limit-test 16 --quiet \
    >train.out 2>&1 || { cat train.out; fail "clgrad train lenet5 (installed, by name)"; }
grep -q "trained" train.out || { cat train.out; fail "no training summary"; }
# the model found is the staged one (the lookup next to the program), not the source tree's
"$dest$bindir/clgrad" train nonesuch --data "$tmp/data" >miss.out 2>&1 && fail "an unknown model name was accepted"
grep -q "$dest$datadir/clgrad/models" miss.out || { cat miss.out; fail "the staged models directory was not searched first"; }
grep -q "shipped: " miss.out || { cat miss.out; fail "the error does not list the shipped models"; }
echo "ok: installed into $dest$prefix (version $version); examples built with pkg-config and run; lenet5 found by name"
