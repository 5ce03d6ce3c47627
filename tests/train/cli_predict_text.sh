#!/bin/sh
# clgrad predict on a token model (a small gpt-like model, 2 blocks, width 32,
# context 32, trained briefly on a fresh random text): its loss on the
# held-out tail equals clgrad eval's (the same windows; eval reduces the
# logits on the device, predict the softmax probabilities on the host), its
# most likely next byte equals greedy generate's at every position of a
# prompt and its continuation, each position's probabilities sum to 1, a
# prefix of a text gets the same rows, and bad input is refused.
# usage: cli_predict_text.sh PATH/TO/clgrad PYTHON
clgrad="$1"; py="$2"
. "$(dirname "$0")/cli_common.sh"
cli_setup cli-predict-text
# 3210 bytes: the held-out tail (the last 321) is 10 windows of 32 + 1 byte
make_words "$tmp/corpus.txt" 3210
tail -c 321 "$tmp/corpus.txt" > "$tmp/tail.txt"
make_small_gpt "$tmp/gpt.cfg"
printf '[net]\nchannels = 1\nheight = 4\nwidth = 4\nclasses = 2\nbatch = 8\n[dense]\nunits = 2\n[softmax]\n' > "$tmp/img.cfg"
W="$tmp/w.safetensors"
check 0 "trained" "the small model trains" -- \
    "$clgrad" train "$tmp/gpt.cfg" --data "text:$tmp/corpus.txt" --steps 150 --no-eval --save "$W"
p() { "$clgrad" predict "$tmp/gpt.cfg" --weights "$W" "$@"; }

# loss on the held-out tail: predict (host, from probabilities) vs eval (device, from logits), eval prints 4 digits
check 0 "windows 10" "eval on the text" -- "$clgrad" eval "$tmp/gpt.cfg" --weights "$W" --data "text:$tmp/corpus.txt"
eval_loss=$(printf '%s\n' "$out" | sed -n 's/^loss //p')
check 0 "text 321 bytes, 320 predicted" "predict on the tail" -- p --data "text:$tmp/tail.txt"
pred_loss=$(printf '%s\n' "$out" | sed -n 's/.*predicted: loss \([0-9.]*\) per byte.*/\1/p')
n=$((n + 1))
echo "loss on the tail: eval $eval_loss, predict $pred_loss"
awk -v a="$eval_loss" -v b="$pred_loss" 'BEGIN { d = a - b; if (a == "" || b == "" || d > 1e-4 || d < -1e-4) exit 1 }' ||
    fail "predict's loss $pred_loss differs from eval's $eval_loss by more than 1e-4"
B='([^\\]|\\[^x]|\\x[0-9a-f]{2})' # a byte as predict prints it: plain, \n \t \' \\, or \xHH
printf '%s\n' "$out" | grep -Eq "^position 0 '$B': next '$B' \(p=0\.[0-9]*\) \| top '$B' 0\.[0-9]* " ||
    fail "the position lines: $(printf '%s\n' "$out" | head -2)"

# greedy generate continues a prompt with predict's most likely byte at each step
prompt="the cat sat"
run "$clgrad" generate "$tmp/gpt.cfg" --weights "$W" --prompt "$prompt" --temperature 0 --tokens 20
[ "$rc" -eq 0 ] || fail "generate: $out"
printf '%s' "$prompt$out" > "$tmp/gen.txt"
check 0 "" "predict --json on the prompt and its continuation" -- p --data "text:$tmp/gen.txt" --json --top-k 256
printf '%s\n' "$out" > "$tmp/gen.json"
p --prompt "the cat" --json --top-k 256 > "$tmp/prefix.json" 2>&1 || fail "predict --prompt: $(cat "$tmp/prefix.json")"
n=$((n + 1))
"$py" - "$tmp/gen.json" "$tmp/prefix.json" "$tmp/gen.txt" ${#prompt} <<'PYEOF' || fail "predict vs greedy generate"
import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
pre = [json.loads(l) for l in open(sys.argv[2])]
text = open(sys.argv[3], "rb").read()
plen = int(sys.argv[4])
summary, rows = rows[-1], rows[:-1]
bad = 0
assert len(rows) == len(text) == summary["bytes"], (len(rows), len(text))
loss = 0.0
for i, r in enumerate(rows):
    probs = {b: p for b, p in r["top"]}
    assert len(probs) == 256 and r["byte"] == text[i] and r["position"] == i
    s = sum(probs.values())
    if abs(s - 1) > 1e-4 or min(probs.values()) < 0:
        print(f"position {i}: probabilities sum to {s}"); bad += 1
    if i + 1 < len(text):
        assert r["next"] == text[i + 1] and r["p_next"] == probs[text[i + 1]]
        loss -= math.log(r["p_next"])
    else:
        assert r["next"] is None
    top = r["top"]
    if i >= plen - 1 and i + 1 < len(text):  # generated: greedy picked the most likely byte
        if top[0][0] != text[i + 1] and top[0][1] - top[1][1] > 1e-5:
            print(f"position {i}: generate chose {text[i + 1]}, predict's top is {top[0]}, {top[1]}"); bad += 1
if abs(loss / (len(text) - 1) - summary["loss"]) > 1e-6 * max(1, loss):
    print("summary loss", summary["loss"], "vs", loss / (len(text) - 1)); bad += 1
for i, r in enumerate(pre[:-1]):  # a prefix gets the same distributions (a causal model)
    full = {b: p for b, p in rows[i]["top"]}
    d = max(abs(p - full[b]) for b, p in r["top"])
    if d > 1e-5:
        print(f"prefix position {i}: probabilities differ by {d}"); bad += 1
print(f"predict vs greedy generate: {len(rows) - plen} generated positions, {bad} problems")
sys.exit(1 if bad else 0)
PYEOF
check 0 "position 2 'e'" "--limit prints the first positions" -- p --prompt "the cat" --limit 3 --top-k 1
n=$((n + 1))
[ "$(printf '%s\n' "$out" | grep -c '^position')" -eq 3 ] || fail "--limit 3 printed: $out"

# refusals
mkdir "$tmp/dir"; : > "$tmp/empty.txt"
check 1 "not a regular file" "a directory" -- p --data "text:$tmp/dir"
check 1 "empty" "an empty file" -- p --data "text:$tmp/empty.txt"
check 1 "cannot open" "a missing file" -- p --data "text:$tmp/missing.txt"
check 2 "empty" "an empty --prompt" -- p --prompt ""
check 2 "not both" "--data and --prompt" -- p --data "text:$tmp/tail.txt" --prompt "x"
check 2 "text:FILE" "--data without text:" -- p --data "$tmp/tail.txt"
check 2 "exclude" "--input with --prompt" -- p --input "$tmp/tail.txt" --prompt "x"
check 2 "top-k" "--top-k 0" -- p --prompt "x" --top-k 0
check 1 "reads token ids.*predict MODEL --data text:FILE" "a token model given images" -- p --input "$tmp/tail.txt"
make_idx "$tmp/img" 4 64 16
check 0 "" "an image model trains" -- \
    "$clgrad" train "$tmp/img.cfg" --data "$tmp/img" --epochs 1 --no-eval --save "$tmp/img.safetensors"
check 1 "takes images" "an image model given a text" -- \
    "$clgrad" predict "$tmp/img.cfg" --weights "$tmp/img.safetensors" --prompt "abc"
cli_done
