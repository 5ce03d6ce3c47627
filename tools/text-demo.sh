#!/bin/sh
# The demo text corpus for byte-level language models (models/gpt-mini.cfg):
# every fortune of Debian's `fortunes` and `fortunes-min` packages
# (/usr/share/games/fortunes: plain-text files, not their .dat indexes or
# .u8 links), concatenated in name order into one file, about 2.5 MB.
#   tools/text-demo.sh [OUT]        writes OUT (default: $CLGRAD_DATA_DIR or
#                                   build/, then fortunes.txt) and prints its path
#   tools/text-demo.sh train [ARGS] also trains gpt-mini on it with ARGS
# Installs the package through tools/setup-deps.sh when it is missing.
set -e
cd "$(dirname "$0")/.."
dir=/usr/share/games/fortunes
[ -d "$dir" ] || sh tools/setup-deps.sh
[ -d "$dir" ] || { echo "text-demo: $dir is missing (apt-get install fortunes)" >&2; exit 1; }
train=0
if [ "${1:-}" = train ]; then train=1; shift; fi
out="${CLGRAD_DATA_DIR:-build}/fortunes.txt"
if [ $train = 0 ] && [ -n "${1:-}" ]; then out="$1"; fi
mkdir -p "$(dirname "$out")"
tmp="$out.tmp.$$"
: > "$tmp"
for f in $(LC_ALL=C ls "$dir"); do
    case "$f" in *.dat|*.u8) continue ;; esac
    [ -f "$dir/$f" ] && [ ! -L "$dir/$f" ] && cat "$dir/$f" >> "$tmp"
done
mv "$tmp" "$out"
echo "$out"
if [ $train = 1 ]; then
    [ -x build/tools/clgrad ] || { meson setup build --buildtype=release >/dev/null && ninja -C build; }
    # shellcheck disable=SC2068
    build/tools/clgrad train models/gpt-mini.cfg --data "text:$out" $@
fi
