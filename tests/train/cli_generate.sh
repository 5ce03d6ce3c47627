#!/bin/sh
# clgrad generate: a small gpt-like model (2 blocks, width 32, context 32)
# trained briefly on a fresh random text; with the key/value cache it gives
# the same bytes as recomputing the window (greedy and sampled, across the
# window slides); a seed repeats its bytes; --precision fp16 halves the cache
# and keeps greedy bytes (or leaves them only at a near-tie); bad input is refused.
# usage: cli_generate.sh PATH/TO/clgrad PYTHON
clgrad="$1"; py="$2"
. "$(dirname "$0")/cli_common.sh"
cli_setup cli-generate
same() { # same DESCRIPTION FILE1 FILE2
    n=$((n + 1))
    if ! cmp -s "$2" "$3" || [ ! -s "$2" ]; then
        echo "FAIL: $1: $2 and $3 differ (or are empty)"; od -c "$2" | head -3; od -c "$3" | head -3
        fails=$((fails + 1))
    fi
}
make_words "$tmp/corpus.txt" 4000
make_small_gpt "$tmp/gpt.cfg"
sed 's/dim = 32/dim = 16/; s/units = 32/units = 16/g' "$tmp/gpt.cfg" > "$tmp/other.cfg"

check 0 "trained" "the small model trains" -- \
    "$clgrad" train "$tmp/gpt.cfg" --data "text:$tmp/corpus.txt" --steps 40 --no-eval --save "$tmp/w.safetensors"
g() { "$clgrad" generate "$tmp/gpt.cfg" --weights "$tmp/w.safetensors" "$@"; }
# greedy and sampled, 80 bytes (context 32: the window slides), cache vs recompute
for mode in "--temperature 0" "--temperature 1 --seed 7" "--temperature 0.7 --top-k 5 --seed 9"; do
    # shellcheck disable=SC2086
    g $mode --tokens 80 --prompt "the cat " > "$tmp/a" 2> "$tmp/err" || { echo "FAIL: generate $mode: $(cat "$tmp/err")"; fails=$((fails + 1)); }
    # shellcheck disable=SC2086
    g $mode --tokens 80 --prompt "the cat " --no-cache > "$tmp/b" 2> "$tmp/err" || { echo "FAIL: generate --no-cache $mode: $(cat "$tmp/err")"; fails=$((fails + 1)); }
    same "cache vs recompute ($mode)" "$tmp/a" "$tmp/b"
    n=$((n + 1))
    [ "$(wc -c < "$tmp/a")" -eq 80 ] || { echo "FAIL: $mode: $(wc -c < "$tmp/a") bytes, not 80"; fails=$((fails + 1)); }
done
g --seed 3 --tokens 60 > "$tmp/s1" 2>/dev/null
g --seed 3 --tokens 60 > "$tmp/s2" 2>/dev/null
same "the same seed repeats its bytes" "$tmp/s1" "$tmp/s2"
check 0 "bytes/s" "--stats" -- "$clgrad" generate "$tmp/gpt.cfg" --weights "$tmp/w.safetensors" --tokens 5 --stats
# refusals
check 2 "tokens" "--tokens 0" -- "$clgrad" generate "$tmp/gpt.cfg" --weights "$tmp/w.safetensors" --tokens 0
check 2 "temperature" "a negative temperature" -- \
    "$clgrad" generate "$tmp/gpt.cfg" --weights "$tmp/w.safetensors" --temperature -1
check 2 "top-k" "--top-k 300" -- "$clgrad" generate "$tmp/gpt.cfg" --weights "$tmp/w.safetensors" --top-k 300
check 2 "weights" "no --weights" -- "$clgrad" generate "$tmp/gpt.cfg"
# fp16 storage: the cache takes half the bytes; greedy bytes equal fp32's, or first differ where fp32's two
# most likely next bytes (predict on the text so far) are within fp16 rounding: a logit gap ln(p1 / p2) below
# 0.05 (half rounds each stored value by up to 4.9e-4 relative; about ten roundings lie on the way to a logit)
check 0 "fp32, cache 16384 bytes" "--stats: fp32 cache bytes" -- \
    "$clgrad" generate "$tmp/gpt.cfg" --weights "$tmp/w.safetensors" --tokens 3 --stats
check 0 "fp16, cache 8192 bytes" "--stats: fp16 cache bytes (half)" -- \
    "$clgrad" generate "$tmp/gpt.cfg" --weights "$tmp/w.safetensors" --tokens 3 --stats --precision fp16
g --precision fp16 --tokens 80 --prompt "the cat " > "$tmp/h80" 2> "$tmp/err" || fail "fp16, 80 bytes: $(cat "$tmp/err")"
n=$((n + 1))
[ "$(wc -c < "$tmp/h80")" -eq 80 ] || fail "fp16 across the window slides: $(wc -c < "$tmp/h80") bytes, not 80"
g --temperature 0 --tokens 23 --prompt "the cat " > "$tmp/g32" 2>&1 || fail "greedy fp32: $(cat "$tmp/g32")"
g --temperature 0 --tokens 23 --prompt "the cat " --precision fp16 > "$tmp/g16" 2>&1 || fail "greedy fp16: $(cat "$tmp/g16")"
n=$((n + 1))
"$py" - "$tmp/g32" "$tmp/g16" "$tmp/upto.txt" <<'PYEOF'
import sys
a, b = open(sys.argv[1], "rb").read(), open(sys.argv[2], "rb").read()
assert len(a) == len(b) == 23, (len(a), len(b))
k = next((i for i in range(23) if a[i] != b[i]), -1)
print(f"greedy fp16 vs fp32: {'the same 23 bytes' if k < 0 else f'first differ at byte {k}'}")
open(sys.argv[3], "wb").write(b"the cat " + a[:k] + bytes([b[k]]) if k >= 0 else b"")
PYEOF
[ $? -eq 0 ] || fail "greedy fp16 vs fp32: lengths"
if [ -s "$tmp/upto.txt" ]; then # the fp16 byte was fp32's runner-up by a logit gap within fp16 rounding
    check 0 "" "predict at the first difference" -- "$clgrad" predict "$tmp/gpt.cfg" --weights "$tmp/w.safetensors" \
        --data "text:$tmp/upto.txt" --json --top-k 2
    printf '%s\n' "$out" | "$py" -c '
import json, math, sys
rows = [json.loads(l) for l in sys.stdin][:-1]
r = rows[-2]  # the position before the fp16 byte
(b1, p1), (b2, p2) = r["top"]
gap = math.log(p1 / p2)
nb = r["next"]
print(f"fp32 top two: {b1} p={p1:.5f}, {b2} p={p2:.5f} (logit gap {gap:.4f}); fp16 chose {nb}")
sys.exit(0 if nb == b2 and gap < 0.05 else 1)' || fail "fp16 left fp32's greedy bytes where they were not near a tie"
fi
check 0 "" "--precision fp32" -- "$clgrad" generate "$tmp/gpt.cfg" --weights "$tmp/w.safetensors" --precision fp32 --tokens 4
check 1 "reads token ids.*clgrad generate" "predict refuses a token model's images, naming generate" -- \
    "$clgrad" predict "$tmp/gpt.cfg" --weights "$tmp/w.safetensors" --input "$tmp/corpus.txt"
check 1 "" "weights of another model" -- "$clgrad" generate "$tmp/other.cfg" --weights "$tmp/w.safetensors"
cli_done
