#!/bin/sh
# Compares the symbols libclgrad exports with the expected list.
# usage: check_symbols.sh LIB EXPECTED
lib="$1"; expected="$2"
command -v nm >/dev/null 2>&1 || { echo "skip: nm not found"; exit 77; }
actual=$(nm -D --defined-only "$lib" | awk '$2 ~ /^[TDBR]$/ {print $3}' | sort)
if [ "$actual" != "$(sort "$expected")" ]; then
    echo "exported symbols differ from $expected (+ exported, - expected):"
    echo "$actual" | diff -u "$expected" - | grep '^[+-][a-z_]'
    exit 1
fi
echo "$(echo "$actual" | wc -l) exported symbols match $expected"
