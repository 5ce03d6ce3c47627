#!/bin/sh
# Two PoCL `basic` devices against one while another process keeps one core
# busy (issue 26 item 2): runs alternate 1 device / 2 devices, each pair
# prints its ratio; the check passes when no 2-device run falls below
# MIN (default 0.8) x the 1-device run before it.
#
#   sh bench/contention.sh [--clgrad build/tools/clgrad] [--model models/lenet5.cfg] [--runs 10]
#                          [--steps 20] [--batch 128] [--min 0.8] [--no-busy] [--logs DIR]
#
# The competitor is `yes > /dev/null` pinned to CPU 0 with taskset (started
# here, stopped on exit). Caches are warmed first (one device, then two),
# so the runs time steady state; the CPU model and load are printed, since
# figures from one machine do not hold on another. --logs DIR keeps each
# run's --verbose log (split moves, algorithm timing) as DIR/run-I-{1,2}.log.
set -u
CLGRAD=build/tools/clgrad
MODEL=models/lenet5.cfg
RUNS=10
STEPS=20
BATCH=128
MIN=0.8
BUSY=1
LOGS=
while [ $# -gt 0 ]; do
    case "$1" in
    --clgrad) CLGRAD=$2; shift 2 ;;
    --model) MODEL=$2; shift 2 ;;
    --runs) RUNS=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --batch) BATCH=$2; shift 2 ;;
    --min) MIN=$2; shift 2 ;;
    --no-busy) BUSY=0; shift ;;
    --logs) LOGS=$2; shift 2 ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "contention.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
[ -x "$CLGRAD" ] || { echo "contention.sh: $CLGRAD is not executable (build first)" >&2; exit 2; }

cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
echo "CPU: ${cpu:-unknown} ($(nproc) online), PoCL: $(dpkg-query -W -f '${Version}' libpocl2 2>/dev/null || echo '?')"
echo "model $MODEL, batch $BATCH, $STEPS timed steps after 3 warm-up, $RUNS pairs"

busy_pid=
cleanup() { [ -n "$busy_pid" ] && kill "$busy_pid" 2>/dev/null; }
trap cleanup EXIT INT TERM

# images/s of one `clgrad bench train` run on $1 (POCL_DEVICES), its log to $2
run() {
    POCL_DEVICES="$1" "$CLGRAD" bench train --model "$MODEL" --batch "$BATCH" --steps "$STEPS" --warmup 3 \
        --devices all --json --verbose 2>"${2:-/dev/null}" | sed -n 's/.*"images_per_s": \([0-9.]*\).*/\1/p' |
        tail -n 1
}
[ -n "$LOGS" ] && mkdir -p "$LOGS"

run basic >/dev/null       # warm the program and algorithm caches
run "basic basic" >/dev/null
if [ "$BUSY" = 1 ]; then
    if command -v taskset >/dev/null 2>&1; then
        taskset -c 0 sh -c 'exec yes > /dev/null' &
    else
        sh -c 'exec yes > /dev/null' &
    fi
    busy_pid=$!
    echo "competitor: yes > /dev/null (pid $busy_pid) on CPU 0"
fi
echo "load: $(cut -d' ' -f1-4 /proc/loadavg)"

fails=0
worst=
i=1
while [ "$i" -le "$RUNS" ]; do
    one=$(run basic "${LOGS:+$LOGS/run-$i-1.log}")
    two=$(run "basic basic" "${LOGS:+$LOGS/run-$i-2.log}")
    if [ -z "$one" ] || [ -z "$two" ]; then
        echo "run $i: clgrad bench train failed" >&2
        exit 1
    fi
    r=$(awk -v a="$two" -v b="$one" 'BEGIN { printf "%.2f", a / b }')
    ok=$(awk -v r="$r" -v m="$MIN" 'BEGIN { print (r >= m) ? "ok" : "BELOW" }')
    [ "$ok" = ok ] || fails=$((fails + 1))
    worst=$(awk -v r="$r" -v w="${worst:-99}" 'BEGIN { print (r < w) ? r : w }')
    printf 'run %2d: 1 device %8.1f img/s, 2 devices %8.1f img/s, ratio %sx %s\n' "$i" "$one" "$two" "$r" "$ok"
    i=$((i + 1))
done
echo "load: $(cut -d' ' -f1-4 /proc/loadavg)"
echo "lowest ratio ${worst}x; $fails of $RUNS below ${MIN}x"
[ "$fails" -eq 0 ]
