# Sourced by the tests/train/cli_*.sh scripts (POSIX sh): the scratch
# directory, the check counters and the data sets they share.
#   . "$(dirname "$0")/cli_common.sh"; cli_setup NAME
# cli_setup NAME: $tmp (removed on exit), fails=0, n=0, $here (this folder).
# run CMD...: $out (stdout and stderr), $rc.
# check CODE PATTERN DESCRIPTION -- CMD...: one check: CMD exits CODE and
#   its output matches the grep PATTERN ("" matches anything).
# fail DESCRIPTION: counts a failed check (fail_now: and exits 1).
# cli_done: the summary line; exits 0 when every check passed, else 1.
# need_devices K NAME: exits 77 (skip) unless clgrad lists K devices.
# make_idx DIR ARGS...: tests/train/make_idx.py (synthetic IDX data).
# make_words FILE BYTES: a fresh text of random words, BYTES long.
# make_mlp FILE: an MLP for make_idx's 8x8 --quadrants data (4 classes): fc1 (16,
#   relu), fc2 (4), softmax; batch 32, learning rate 0.1.
# make_small_gpt FILE: a gpt-like token model: 2 pre-layer-norm blocks, 2 heads,
#   width 32, MLP 64 (GELU), context 32, head tied to the embedding.
# shellcheck disable=SC2154 # clgrad and py: set by the sourcing script
here=$(cd "$(dirname "$0")" && pwd)
cli_setup() {
    tmp=$(mktemp -d "/tmp/clgrad-$1-XXXXXX") || exit 1
    trap 'rm -rf "$tmp"' EXIT
    fails=0; n=0
}
run() { out=$("$@" 2>&1); rc=$?; }
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
fail_now() { echo "FAIL: $*"; exit 1; }
check() { # check CODE PATTERN DESCRIPTION -- command...
    code=$1; pat=$2; desc=$3; shift 4
    n=$((n + 1))
    run "$@"
    if [ "$rc" -ne "$code" ] || ! printf '%s\n' "$out" | grep -q -- "$pat"; then
        echo "FAIL: $desc: exit $rc (expected $code), output lacks '$pat':"; printf '%s\n' "$out" | tail -8
        fails=$((fails + 1))
    fi
}
cli_done() {
    if [ "$fails" -eq 0 ]; then echo "ok: $n checks"; exit 0; fi
    echo "$fails of $n checks failed"; exit 1
}
need_devices() { # need_devices K NAME
    if [ "$("$clgrad" devices 2>/dev/null | grep -c '^device [0-9]')" -lt "$1" ]; then
        echo "$2: needs $1 OpenCL devices (POCL_DEVICES=\"pthread pthread\")"; exit 77
    fi
}
make_idx() { "$py" "$here/make_idx.py" "$@" || { echo "cannot write the dataset"; exit 1; }; }
make_words() { # make_words FILE BYTES
    "$py" - "$1" "$2" <<'PYEOF' || { echo "cannot write the corpus"; exit 1; }
import random, sys
rng = random.Random()
words = ["the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "far", "\n"]
size = int(sys.argv[2])
s = ""
while len(s) < size:
    s += rng.choice(words) + " "
open(sys.argv[1], "w").write(s[:size])
PYEOF
}
make_small_gpt() { # make_small_gpt FILE
    {
        printf '[net]\nchannels = 1\nheight = 32\nwidth = 1\ninput = tokens\nclasses = 256\nbatch = 8\n'
        printf 'optimizer = adamw\nlearning_rate = 0.003\n'
        printf '[embedding]\nname = tok\nvocab = 256\ndim = 32\n[posembed]\nname = pos\ncontext = 32\n'
        prev=pos
        for b in 1 2; do
            printf '[layernorm]\nname = b%s_ln1\n[attention]\nname = b%s_attn\nheads = 2\n' $b $b
            printf '[add]\nname = b%s_res1\ninput = %s, b%s_attn\n' $b $prev $b
            printf '[layernorm]\nname = b%s_ln2\n[dense]\nname = b%s_fc\nunits = 64\nactivation = gelu\n' $b $b
            printf '[dense]\nname = b%s_proj\nunits = 32\n[add]\nname = b%s_res2\ninput = b%s_res1, b%s_proj\n' $b $b $b $b
            prev=b${b}_res2
        done
        printf '[layernorm]\nname = ln_f\n[dense]\nname = head\nunits = 256\ntie = tok\nbias = 0\n[softmax]\n'
    } > "$1"
}
make_mlp() { # make_mlp FILE
    printf '[net]\nchannels = 1\nheight = 8\nwidth = 8\nclasses = 4\nbatch = 32\nlearning_rate = 0.1\n' > "$1"
    printf '[dense]\nname = fc1\nunits = 16\nactivation = relu\n[dense]\nname = fc2\nunits = 4\n[softmax]\n' >> "$1"
}
