#!/bin/sh
# Compares the symbols libclgrad exports with the expected list, and (given
# SONAME) the library's SONAME with the one meson.build sets from
# CLG_ABI_VERSION.
# usage: check_symbols.sh LIB EXPECTED [SONAME]
lib="$1"; expected="$2"; soname="${3:-}"
command -v nm >/dev/null 2>&1 || { echo "skip: nm not found"; exit 77; }
actual=$(nm -D --defined-only "$lib" | awk '$2 ~ /^[TDBR]$/ {print $3}' | sort)
if [ "$actual" != "$(sort "$expected")" ]; then
    echo "exported symbols differ from $expected (+ exported, - expected):"
    echo "$actual" | diff -u "$expected" - | grep '^[+-][a-z_]'
    exit 1
fi
echo "$(echo "$actual" | wc -l) exported symbols match $expected"
if [ -n "$soname" ] && command -v readelf >/dev/null 2>&1; then
    got=$(readelf -d "$lib" | sed -n 's/.*(SONAME).*\[\(.*\)\].*/\1/p')
    [ "$got" = "$soname" ] || { echo "SONAME is '$got', expected '$soname'"; exit 1; }
    echo "SONAME $got"
fi
