#!/bin/sh
# Makes a Python venv with onnxruntime from PyPI for the ONNX export test and
# prints its python. Bounded: pip gets CLGRAD_ORT_TIMEOUT seconds (default
# 300). Exit 77 (skip) when the venv or the package cannot be had (offline,
# no venv module); an existing venv with onnxruntime is reused.
# usage: ort_setup.sh VENV_DIR
set -u
venv=${1:?usage: ort_setup.sh VENV_DIR}
py="$venv/bin/python"
if [ -x "$py" ] && "$py" -c "import onnxruntime" >/dev/null 2>&1; then echo "$py"; exit 0; fi
base=$(command -v /usr/bin/python3 || command -v python3) || { echo "skip: no python3" >&2; exit 77; }
t=${CLGRAD_ORT_TIMEOUT:-300}
if ! timeout "$t" "$base" -m venv "$venv" >&2; then echo "skip: cannot create a venv with $base" >&2; exit 77; fi
if ! timeout "$t" "$py" -m pip install -q --disable-pip-version-check --timeout 30 onnxruntime >&2; then
    echo "skip: onnxruntime could not be installed from PyPI within ${t}s (offline?)" >&2; exit 77
fi
"$py" -c "import onnxruntime" >/dev/null 2>&1 || { echo "skip: onnxruntime does not import" >&2; exit 77; }
echo "$py"
