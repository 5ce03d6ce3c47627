#!/bin/sh
# Runs a test program under oclgrind and fails on any report it makes
# (data races, uninitialized values, out-of-bounds, API misuse).
# usage: oclgrind_check.sh PROGRAM [ARGS...]
command -v oclgrind >/dev/null 2>&1 || { echo "skip: oclgrind not installed"; exit 77; }
log=$(mktemp)
CLGRAD_TEST_TINY=1 CLGRAD_CACHE=0 oclgrind --data-races --uninitialized --check-api --log "$log" "$@"
rc=$?
if [ -s "$log" ]; then
    echo "oclgrind reported problems:"; head -60 "$log"; rm -f "$log"; exit 1
fi
rm -f "$log"
[ "$rc" -eq 77 ] && exit 77
[ "$rc" -eq 0 ] || { echo "program failed under oclgrind (exit $rc)"; exit 1; }
echo "oclgrind: clean"
