#!/bin/sh
# docs/options.md and the ENVIRONMENT section of docs/clgrad.1 are generated
# by `clgrad options --format md|man`; fails when the checked-in files differ.
# usage: docs_options.sh PATH/TO/clgrad docs/options.md docs/clgrad.1 [--update]
clgrad="$1"; md="$2"; man="$3"; update="${4:-}"
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
"$clgrad" options --format md > "$tmp/options.md" || { echo "clgrad options --format md failed"; exit 1; }
"$clgrad" options --format man > "$tmp/env.roff" || { echo "clgrad options --format man failed"; exit 1; }
# the man page with its ENVIRONMENT section (up to the next .SH) replaced
awk -v sec="$tmp/env.roff" '
    /^\.SH ENVIRONMENT/ { while ((getline l < sec) > 0) print l; skip = 1; next }
    skip && /^\.SH / { skip = 0 }
    !skip { print }' "$man" > "$tmp/clgrad.1"
grep -q '^\.SH ENVIRONMENT' "$man" || { echo "$man has no .SH ENVIRONMENT section"; exit 1; }
if [ "$update" = "--update" ]; then
    cp "$tmp/options.md" "$md" && cp "$tmp/clgrad.1" "$man" && echo "updated $md and $man"
    exit $?
fi
rc=0
diff -u "$md" "$tmp/options.md" || { echo "$md is out of date: run tests/docs_options.sh $clgrad $md $man --update"; rc=1; }
diff -u "$man" "$tmp/clgrad.1" || { echo "$man (ENVIRONMENT) is out of date: run tests/docs_options.sh ... --update"; rc=1; }
[ $rc -eq 0 ] && echo "docs/options.md and the man page's ENVIRONMENT section match clgrad options"
exit $rc
