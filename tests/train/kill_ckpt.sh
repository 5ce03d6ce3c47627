#!/bin/sh
# Crash safety of checkpoints: SIGKILLs `clgrad train --checkpoint D` at
# random times while it writes a checkpoint every epoch (tiny epochs, a
# ~2 MB checkpoint), then checks that the checkpoint that existed before
# each kill still exists and loads (0 lost), and that the next completed
# run leaves no stale temporary file. usage: kill_ckpt.sh PATH/TO/clgrad PYTHON [TRIALS]
clgrad="$1"; py="$2"; trials=${3:-10}
tmp=$(mktemp -d /tmp/clgrad-kill-XXXXXX) || exit 1
trap 'rm -rf "$tmp"' EXIT
"$py" "$(dirname "$0")/make_idx.py" "$tmp/data" 8 32 8 || { echo "cannot write the dataset"; exit 1; }
printf '[net]\nchannels = 1\nheight = 8\nwidth = 8\nclasses = 2\nbatch = 16\n[dense]\nname = fc1\nunits = 4096\nactivation = relu\n[dense]\nname = fc2\nunits = 2\n[softmax]\n' \
    > "$tmp/m.cfg"
ck="$tmp/ck"
loads() { "$clgrad" eval "$tmp/m.cfg" --weights "$ck/last.safetensors" --data "$tmp/data" >/dev/null 2>&1; }
rnd() { od -An -N2 -tu2 /dev/urandom | tr -d ' '; } # 0..65535
lost=0; midwrite=0; written=0; fails=0
i=0
while [ "$i" -lt "$trials" ]; do
    i=$((i + 1))
    had=0; [ -f "$ck/last.safetensors" ] && had=1
    resume=""; [ "$had" -eq 1 ] && resume=--resume
    before=$({ cksum < "$ck/last.safetensors"; } 2>/dev/null)
    "$clgrad" train "$tmp/m.cfg" --data "$tmp/data" --epochs 1000000 --checkpoint "$ck" $resume --seed "$i" \
        >/dev/null 2>&1 &
    pid=$!
    # 0.3 .. 2.3 s: past start-up (device, kernels), into the epoch/checkpoint loop
    ms=$((300 + $(rnd) % 2000))
    sleep "$((ms / 1000)).$(printf '%03d' $((ms % 1000)))"
    kill -KILL "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    ls "$ck"/last.safetensors.tmp.* >/dev/null 2>&1 && midwrite=$((midwrite + 1))
    if [ -f "$ck/last.safetensors" ]; then
        [ "$(cksum < "$ck/last.safetensors")" != "$before" ] && written=$((written + 1))
        if ! loads; then
            echo "FAIL: trial $i (killed after $ms ms): last.safetensors does not load"; lost=$((lost + 1))
        fi
    elif [ "$had" -eq 1 ]; then
        echo "FAIL: trial $i (killed after $ms ms): last.safetensors disappeared"; lost=$((lost + 1))
    fi
done
# the next completed run sweeps what killed writers left: also one planted
# as a kill before these trials would leave it (old mtime); look-alikes of
# other names stay
touch -d '1 hour ago' "$ck/last.safetensors.tmp.Zq81xA" "$ck/notes.tmp.Zq81xA" "$ck/last.safetensors.tmp.keep"
if ! "$clgrad" train "$tmp/m.cfg" --data "$tmp/data" --epochs 1 --checkpoint "$ck" >/dev/null 2>&1; then
    echo "FAIL: the run after the kills failed"; fails=$((fails + 1))
fi
[ -f "$ck/notes.tmp.Zq81xA" ] && [ -f "$ck/last.safetensors.tmp.keep" ] ||
    { echo "FAIL: a file of another pattern was removed"; fails=$((fails + 1)); }
rm -f "$ck/notes.tmp.Zq81xA" "$ck/last.safetensors.tmp.keep"
stale=$(ls "$ck" | grep -c '\.tmp\.')
[ "$stale" -eq 0 ] || { echo "FAIL: $stale stale temporary file(s) after the next run:"; ls "$ck"; fails=$((fails + 1)); }
loads || { echo "FAIL: final checkpoint does not load"; fails=$((fails + 1)); }
[ "$written" -gt 0 ] || { echo "FAIL: no kill came after a checkpoint write (trials too short?)"; fails=$((fails + 1)); }
echo "kill: $trials trials, $written new checkpoints, $midwrite killed mid-write, $lost checkpoints lost or unloadable, $stale stale temporary files after the next run"
[ "$lost" -eq 0 ] && [ "$fails" -eq 0 ]
