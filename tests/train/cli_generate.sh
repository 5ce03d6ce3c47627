#!/bin/sh
# clgrad generate: a small gpt-like model (2 blocks, width 32, context 32)
# trained briefly on a fresh random text; with the key/value cache it gives
# the same bytes as recomputing the window (greedy and sampled, across the
# window slides); a seed repeats its bytes; bad input is refused.
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
check 1 "precision fp16 is not supported yet" "--precision fp16 refused, naming fp32" -- \
    "$clgrad" generate "$tmp/gpt.cfg" --weights "$tmp/w.safetensors" --precision fp16
check 0 "" "--precision fp32" -- "$clgrad" generate "$tmp/gpt.cfg" --weights "$tmp/w.safetensors" --precision fp32 --tokens 4
check 1 "reads token ids.*clgrad generate" "predict refuses a token model's images, naming generate" -- \
    "$clgrad" predict "$tmp/gpt.cfg" --weights "$tmp/w.safetensors" --input "$tmp/corpus.txt"
check 1 "" "weights of another model" -- "$clgrad" generate "$tmp/other.cfg" --weights "$tmp/w.safetensors"
cli_done
