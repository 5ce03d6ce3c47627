#!/bin/sh
# Device check, run from a clgrad bundle (tools/device-bundle.sh) on a lent
# machine: finds the vendor's OpenCL driver even with no ICD file registered,
# then runs, each step under its own timeout and all within 8 minutes:
#   system     uname, CPU, GPUs (nvidia-smi / rocm-smi when present), the drivers found
#   devices    clgrad devices (text and --json)
#   selfcheck  clgrad selfcheck
#   tests      the GEMM, limits and layer test binaries
#   gemm       clgrad bench gemm 2048^3 and the DL shapes (also with split-K off:
#              CLGRAD_GEMM_SPLITK=0); cuBLAS through a
#              tiny probe when nvcc is on the machine
#   train      clgrad bench train on every shipped model
#   peers      where python3 has PyTorch with a GPU: the same models in PyTorch
#              (bench/train_vs_torch.py, bench/gpt_vs_torch.py --torch-device cuda)
#              and gpt-mini's held-out loss after training on data/fortunes.txt
#   tests      the bundle's other C test binaries, in the time left
# Everything goes to one results folder (one log per step, summary.txt).
#
# usage: sh device-check.sh [--smoke] [--no-system-icd] [--devices SEL] [--only PATTERNS] [RESULTS_DIR]
#   --smoke          seconds, not minutes: a few tests, small GEMMs, LeNet-5 only (the CI test)
#   --no-system-icd  ignore /etc/OpenCL/vendors: only drivers found by the search
#   --devices SEL    clgrad's device selector (default: gpu when there is one, else all)
#   --only PATTERNS  run only the steps whose names match these comma-separated shell
#                    patterns (e.g. 'test-test_prim,torch-*,gpt-*'; `devices` always runs)
#   RESULTS_DIR      default ./device-check-<date>
# Environment: CLGRAD_DRIVER_DIRS (more directories to search), DEVICE_CHECK_BUDGET (seconds,
# default 480), CLGRAD_CACHE_DIR (default RESULTS_DIR/cache; the smoke test reuses the suite's),
# CLGRAD_PEERS_PYTHON (python3), DEVICE_CHECK_TORCH_MODELS (lenet5,vgg-s,resnet-mini,resnet20).
set -u
here=$(cd "$(dirname "$0")" && pwd)
smoke=0; sysicd=1; sel=""; res=""; only=""
while [ $# -gt 0 ]; do
    case "$1" in
    --smoke) smoke=1 ;;
    --no-system-icd) sysicd=0 ;;
    --devices) shift; sel="${1:-}" ;;
    --only) shift; only="${1:-}" ;;
    -h|--help) sed -n '2,27p' "$0"; exit 0 ;;
    -*) echo "device-check: unknown option $1" >&2; exit 2 ;;
    *) res="$1" ;;
    esac
    shift
done
res=${res:-$PWD/device-check-$(date -u +%Y%m%d-%H%M%S)}
mkdir -p "$res" || exit 1
res=$(cd "$res" && pwd)
budget=${DEVICE_CHECK_BUDGET:-480}
t0=$(date +%s)
summary="$res/summary.txt"
: > "$summary"
say() { echo "$*" | tee -a "$summary"; }

# ---- libraries: the bundle's, its fallbacks only where the machine lacks them ----
libpath="$here/lib"
for l in libstdc++.so.6 libgcc_s.so.1; do
    found=0
    for d in /lib/x86_64-linux-gnu /usr/lib/x86_64-linux-gnu /lib64 /usr/lib64 /lib /usr/lib /lib/aarch64-linux-gnu /usr/lib/aarch64-linux-gnu; do
        [ -e "$d/$l" ] && found=1 && break
    done
    [ $found = 1 ] || libpath="$libpath:$here/lib/fallback"
done
export LD_LIBRARY_PATH="$libpath${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export CLGRAD_CACHE_DIR="${CLGRAD_CACHE_DIR:-$res/cache}" CLGRAD_BACKGROUND_TUNE=off CLGRAD_MODEL_DIR="$here/models"
export CK_DEFAULT_TIMEOUT=${CK_DEFAULT_TIMEOUT:-300}
# each test case's result as it ends, line-buffered: a step stopped at its
# limit still shows which case it was in
export CK_VERBOSITY=${CK_VERBOSITY:-verbose}
lb=""; command -v stdbuf > /dev/null 2>&1 && lb="stdbuf -oL"
: "${HOME:=$res/home}"; export HOME; mkdir -p "$HOME" 2>/dev/null
clgrad="$here/bin/clgrad.real"

# ---- OpenCL drivers: search, then a generated ICD folder ----
icd="$res/icd"
mkdir -p "$icd"
dirs="/usr/lib/x86_64-linux-gnu /usr/lib64 /usr/lib /lib/x86_64-linux-gnu /lib64 /usr/local/lib /usr/local/lib64
      /usr/lib/x86_64-linux-gnu/nvidia/current /usr/lib/nvidia /usr/lib64/nvidia /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/local/cuda/lib64
      /opt/rocm/lib /opt/rocm/opencl/lib /opt/rocm/lib64 /opt/intel/opencl /usr/lib/x86_64-linux-gnu/intel-opencl
      /usr/lib/wsl/lib /usr/lib/aarch64-linux-gnu ${CLGRAD_DRIVER_DIRS:-}"
names="libnvidia-opencl.so.1 libamdocl64.so libamdocl-orca64.so libigdrcl.so libpocl.so.2 libpocl.so"
files=""
for n in $names; do
    for d in $dirs; do
        f="$d/$n"
        [ -e "$f" ] || continue
        f=$(readlink -f "$f")
        case " $files " in *" $f "*) continue ;; esac
        files="$files $f"
        echo "$f" > "$icd/$(basename "$n" | sed 's/\.so.*//').icd"
        break
    done
done
# the drivers a registered ICD file names (unless --no-system-icd)
if [ $sysicd = 1 ] && [ -d /etc/OpenCL/vendors ]; then
    for v in /etc/OpenCL/vendors/*.icd; do
        [ -f "$v" ] || continue
        lib=$(head -n 1 "$v")
        case " $files " in *"$lib"*) continue ;; esac
        files="$files $lib"
        cp "$v" "$icd/system-$(basename "$v")"
    done
fi
export OCL_ICD_VENDORS="$icd"                                      # ocl-icd: a folder of .icd files
export OCL_ICD_FILENAMES=$(echo $files | tr ' ' ':')               # the Khronos loader: the libraries
say "device-check $(date -u +%Y-%m-%dT%H:%M:%SZ) $(uname -srm) smoke=$smoke budget=${budget}s"
say "bundle: $(head -n 1 "$here/MANIFEST" 2>/dev/null)"
say "drivers: ${files:-none found}"
[ -n "$files" ] || { say "FAIL: no OpenCL driver found (searched: $names in $dirs)"; exit 1; }

# ---- steps ----
fails=0
wanted() { # wanted NAME: 0 when --only selects the step NAME
    [ -n "$only" ] && [ "$1" != devices ] || return 0
    set -f # the patterns are not file names
    for pat in $(echo "$only" | tr ',' ' '); do
        # shellcheck disable=SC2254
        case "$1" in $pat) set +f; return 0 ;; esac
    done
    set +f
    return 1
}
step() { # step NAME LIMIT_S command...  (log: RESULTS/NAME.log)
    name=$1; lim=$2; shift 2
    wanted "$name" || return 0
    left=$((budget - ($(date +%s) - t0)))
    if [ $left -le 5 ]; then say "skip  $name (budget spent)"; return 1; fi
    [ "$lim" -le "$left" ] || lim=$left
    s=$(date +%s)
    timeout -k 5 "$lim" "$@" > "$res/$name.log" 2>&1
    rc=$?
    dt=$(($(date +%s) - s))
    if [ $rc = 0 ]; then say "ok    $name (${dt}s)"
    elif [ $rc = 77 ]; then say "skip  $name (${dt}s, exit 77)"
    elif [ $rc = 124 ] || [ $rc = 137 ]; then say "TIME  $name (limit ${lim}s)"; fails=$((fails + 1))
    else say "FAIL  $name (exit $rc, ${dt}s): $(tail -n 2 "$res/$name.log" | tr '\n' ' ' | cut -c1-200)"; fails=$((fails + 1)); fi
    return $rc
}

{
    uname -a; echo
    (lscpu 2>/dev/null || cat /proc/cpuinfo) | head -n 20; echo
    command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    command -v rocm-smi >/dev/null 2>&1 && rocm-smi --showproductname
    echo "drivers:$files"; echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
} > "$res/system.log" 2>&1

# ---- PyTorch on the same machine (python3 with torch and a GPU; bench/ scripts in the bundle) ----
# The same models and recipes as the CPU tables: training throughput, then gpt-mini's
# held-out loss after as many steps (up to 3000) as clgrad's measured speed fits in ~70 s.
peers() {
    py=$(command -v "${CLGRAD_PEERS_PYTHON:-python3}" 2>/dev/null) || py=""
    [ -n "$py" ] || { say "skip  torch peers (no ${CLGRAD_PEERS_PYTHON:-python3})"; return 0; }
    [ -f "$here/bench/train_vs_torch.py" ] || { say "skip  torch peers (no bench/ in the bundle)"; return 0; }
    if ! env -u LD_LIBRARY_PATH "$py" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' \
        > /dev/null 2>&1; then
        say "skip  torch peers ($py has no PyTorch with a GPU)"; return 0
    fi
    export CLGRAD_PEERS_PYTHON="$py"
    step torch-train 240 env -u LD_LIBRARY_PATH "$py" "$here/bench/train_vs_torch.py" --clgrad "$here/bin/clgrad" \
        --models "${DEVICE_CHECK_TORCH_MODELS:-lenet5,vgg-s,resnet-mini,resnet20}" --sides clgrad,torch2,torch2-cl --devices "$sel" --torch-device cuda \
        --repeat 1 --json "$res/torch-train.json"
    step gpt-speed 60 env -u LD_LIBRARY_PATH "$py" "$here/bench/gpt_vs_torch.py" speed --clgrad "$here/bin/clgrad" \
        --sides clgrad,torch2 --devices "$sel" --torch-device cuda --repeat 1 --json "$res/gpt-speed.json"
    wanted gpt-quality || return 0
    [ -f "$here/data/fortunes.txt" ] || { say "skip  gpt quality (no data/fortunes.txt in the bundle)"; return 0; }
    tps=$(sed -n 's/.*"images_per_s": *\([0-9.]*\).*/\1/p' "$res/train-gpt-mini.log" 2>/dev/null | head -n 1)
    qsteps=$(awk -v r="${tps:-0}" 'BEGIN { s = int(r * 128 * 70 / 4096); if (s > 3000) s = 3000; if (s < 100) s = 100; print s }')
    say "gpt quality: $qsteps steps (clgrad gpt-mini at ${tps:-?} sequences/s)"
    step gpt-quality 200 env -u LD_LIBRARY_PATH "$py" "$here/bench/gpt_vs_torch.py" quality --clgrad "$here/bin/clgrad" \
        --data "$here/data/fortunes.txt" --steps "$qsteps" --sides clgrad,torch2 --devices "$sel" \
        --torch-device cuda --svg "$res/gpt-quality.svg" --json "$res/gpt-quality.json"
}

cd "$res" || exit 1 # tests write scratch files relative to the working directory
step devices 60 "$clgrad" devices || { say "FAIL: clgrad sees no OpenCL device"; exit 1; }
"$clgrad" devices --json > "$res/devices.json" 2>/dev/null
if [ -z "$sel" ]; then
    if grep -q '"type":"gpu"' "$res/devices.json"; then sel=gpu; else sel=all; fi
fi
say "devices: --devices $sel ($(grep -c '^device ' "$res/devices.log") listed)"
step selfcheck 120 "$clgrad" selfcheck --devices "$sel"

if [ $smoke = 1 ]; then
    for t in test_core test_tune_family; do
        [ -x "$here/tests/$t" ] && step "test-$t" 120 $lb "$here/tests/$t"
    done
    step gemm 60 "$clgrad" bench gemm --devices "$sel" --m 256 --n 256 --k 256 --backend own --reps 2
    step train-lenet5 120 env CLGRAD_CONV_AUTO_MEASURE=0 "$clgrad" bench train --model "$here/models/lenet5.cfg" --devices "$sel" --batch 8 \
        --steps 2 --warmup 1
else
    # the kernels' correctness first (the tests most likely to find a GPU
    # problem), then the benchmarks, then the remaining tests in what is left
    # (test_wfused and test_conv build a dozen fused-Winograd programs each:
    # NVIDIA's compiler took 1-13 s per program on an H100, ~90 s for
    # test_wfused, so they run with the other tests, under longer limits)
    first="test_gemm test_gemm_packed test_gemm_splitk test_limits test_model_layers"
    for t in $first; do
        [ -x "$here/tests/$t" ] && step "test-$t" 90 $lb "$here/tests/$t"
    done
    step gemm-2048 90 "$clgrad" bench gemm --devices "$sel" --m 2048 --n 2048 --k 2048 --reps 3
    step gemm-dl 90 "$clgrad" bench gemm --devices "$sel" --shapes dl --backend own --reps 3
    # the same without split-K (A/B for its automatic choice on the weight gradients)
    step gemm-dl-nosplitk 90 env CLGRAD_GEMM_SPLITK=0 "$clgrad" bench gemm --devices "$sel" --shapes dl --backend own --reps 3
    nvcc=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null | head -n 1)
    # the prebuilt probe where the CUDA runtime resolves (no compile time), else nvcc here
    if [ -x "$here/bin/cublas_probe" ] && ! ldd "$here/bin/cublas_probe" 2>/dev/null | grep -q "not found"; then
        step cublas 60 "$here/bin/cublas_probe"
    elif [ -n "$nvcc" ] && [ -f "$here/cublas_probe.cu" ]; then
        step cublas 150 sh -c "'$nvcc' -O2 -o '$res/cublas_probe' '$here/cublas_probe.cu' -lcublas && '$res/cublas_probe'"
    elif command -v hipcc >/dev/null 2>&1; then
        say "skip  hipblas probe (not written yet; hipcc found at $(command -v hipcc))"
    else
        say "skip  vendor BLAS probe (no nvcc, and no CUDA runtime for the bundle's prebuilt probe)"
    fi
    for m in lenet5 vgg-s resnet-mini resnet20 gpt-mini; do
        [ -f "$here/models/$m.cfg" ] && step "train-$m" 60 "$clgrad" bench train --model "$here/models/$m.cfg" \
            --devices "$sel" --steps 20 --warmup 3 --json
    done
    peers
    for t in $(ls "$here/tests"); do
        case " $first " in *" $t "*) continue ;; esac
        case $t in test_wfused) lim=240 ;; test_conv) lim=180 ;; *) lim=90 ;; esac
        step "test-$t" $lim $lb "$here/tests/$t"
    done
fi
say "done in $(($(date +%s) - t0)) s: $fails step(s) failed; results in $res"
[ $fails = 0 ]
