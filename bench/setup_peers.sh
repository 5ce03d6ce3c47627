#!/bin/sh
# Creates the benchmark peers' virtual environment: PyTorch 2.x and tinygrad
# from PyPI, for bench/train_vs_torch.py and bench/conv_vs_torch.py. Not a
# build, test or CI dependency (those use only Debian's python3-torch 1.13).
#
# usage: sh bench/setup_peers.sh [VENV]     (default $CLGRAD_PEERS_VENV, else /work/venv-peers)
#   PYTHON=python3.11 sh bench/setup_peers.sh   interpreter that creates the venv (>= 3.10 with venv + pip)
#   TORCH_SPEC='torch==2.15.0'                  pin a version (default: the newest torch on PyPI)
#
# PyPI publishes only the CUDA build of torch for Linux x86-64 (its CPU-only
# wheels are on PyTorch's own package index, which this setup does not use),
# and that wheel's libtorch links the CUDA libraries, so `pip install
# --no-deps torch` fails at `import torch` (libcufile.so.0 missing). The
# script therefore installs the wheel with its CUDA packages (about 5 GiB,
# never loaded onto a GPU here: the benchmarks set CUDA_VISIBLE_DEVICES="" and
# run on the CPU), then checks that torch imports, runs a CPU matmul, has
# oneDNN (channels-last) and that torch.compile's CPU backend (inductor, C++
# compiler from the system) works; and that tinygrad sees the OpenCL device.
set -eu
VENV=${1:-${CLGRAD_PEERS_VENV:-/work/venv-peers}}
PY=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch}

if ! "$PY" -c 'import sys, venv; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
    echo "setup_peers: $PY is missing or older than 3.10 (or has no venv module); set PYTHON=" >&2
    exit 1
fi
if [ ! -x "$VENV/bin/python" ]; then
    echo "setup_peers: creating $VENV with $("$PY" --version 2>&1)"
    "$PY" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --upgrade --quiet pip
echo "setup_peers: installing $TORCH_SPEC and tinygrad from PyPI (the torch wheel brings its CUDA libraries)"
"$VENV/bin/python" -m pip install --quiet "$TORCH_SPEC" tinygrad numpy

echo "setup_peers: checking"
CUDA_VISIBLE_DEVICES="" "$VENV/bin/python" - <<'EOF'
import torch
x = torch.randn(64, 64)
assert torch.allclose(x @ torch.eye(64), x), "CPU matmul"
assert torch.__version__.split(".")[0] >= "2", torch.__version__
assert torch.backends.mkldnn.is_available(), "oneDNN missing"
f = torch.compile(lambda a: torch.relu(a) * 2)
assert torch.allclose(f(x), torch.relu(x) * 2), "torch.compile"
print("torch", torch.__version__, "ok: CPU matmul, oneDNN, torch.compile (inductor)")
EOF
DEV=CL "$VENV/bin/python" - <<'EOF'
from tinygrad import Device, Tensor
t = (Tensor.ones(4, 4) * 3).sum().item()
assert t == 48.0, t
from importlib.metadata import version
print("tinygrad", version("tinygrad"), "ok on", Device.DEFAULT)
EOF
echo "setup_peers: done; use CLGRAD_PEERS_VENV=$VENV (the bench scripts' default is /work/venv-peers)"
