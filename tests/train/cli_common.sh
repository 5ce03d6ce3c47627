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
# mpi_setup NAME BUILT SECONDS [DROPOUT]: the MPI tests' common part: exits 77
#   unless BUILT is 1 and mpirun is on PATH; $tmp (removed on exit with the
#   processes listed in $bg), fails=0, Open MPI allowed as root and
#   oversubscribed; mpi NP CMD... (mpirun under a SECONDS timeout, passing
#   POCL_DEVICES and CLGRAD_CACHE_DIR); cmp_w A B TOL (st_compare.py);
#   $tmp/data (8x8, 2 classes, 96 + 32 images), $tmp/mlp.cfg (conv 4x3x3, relu,
#   fc1 8 relu, [dropout p = DROPOUT when given], fc2 2, softmax; batch 24,
#   SGD momentum), $tmp/bn.cfg (the same with batch norm after the conv),
#   $T (20 steps, no eval, quiet).
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
mpi_setup() { # mpi_setup NAME BUILT SECONDS [DROPOUT]
    [ "$2" = 1 ] || { echo "skip: clgrad built without MPI (meson feature 'mpi' off or Open MPI not found)" >&2; exit 77; }
    command -v mpirun >/dev/null 2>&1 || { echo "skip: no mpirun on PATH (Debian: openmpi-bin)" >&2; exit 77; }
    tmp=$(mktemp -d "/tmp/clgrad-$1-XXXXXX") || exit 1
    bg=""
    trap 'for p in $bg; do kill -9 $p 2>/dev/null; done; rm -rf "$tmp"' EXIT
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
    # (Open MPI picks its transports: shared memory on one machine; TCP would need
    # an interface other than loopback, which it excludes by default)
    fails=0; mpi_timeout=$3
    make_idx "$tmp/data" 8 96 32
    {
        printf '[net]\nchannels = 1\nheight = 8\nwidth = 8\nclasses = 2\nbatch = 24\nlearning_rate = 0.02\n'
        printf 'momentum = 0.9\n[convolutional]\nname = c1\nfilters = 4\nsize = 3\npad = 1\n'
        printf '[activation]\nname = r1\ntype = relu\n[dense]\nname = fc1\nunits = 8\nactivation = relu\n'
        [ -z "$4" ] || printf '[dropout]\nname = d1\np = %s\n' "$4"
        printf '[dense]\nname = fc2\nunits = 2\n[softmax]\n'
    } > "$tmp/mlp.cfg"
    sed 's/^\[activation\]$/[batchnorm]\nname = bn1\n[activation]/' "$tmp/mlp.cfg" > "$tmp/bn.cfg"
    grep -q batchnorm "$tmp/bn.cfg" || { echo "cannot write the batch-norm model"; exit 1; }
    T="--data $tmp/data --epochs 100 --steps 20 --no-eval --quiet"
}
mpi() { np=$1; shift; timeout "$mpi_timeout" mpirun -np "$np" --oversubscribe --bind-to none -x POCL_DEVICES -x CLGRAD_CACHE_DIR "$@"; }
cmp_w() { "$py" "$here/st_compare.py" "$1" "$2" "$3"; }
