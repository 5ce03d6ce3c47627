"""clgrad's ONNX export of a transformer against PyTorch and onnxruntime.

Run by test_onnx_seq (tests/onnx/test_onnx_seq.c) under Debian's
/usr/bin/python3 (python3-torch):
    seq_check.py MODEL.onnx IDS.f32 WANT.f32 B T ORT_VENV_DIR
IDS.f32: B*T token ids (float32), WANT.f32: clgrad's forward (probabilities,
B*T*V float32). Checks, each within TOL of clgrad:
  - a PyTorch twin (float64) built by hand from the exported initializers by
    name (torch.nn.functional: embedding, layer_norm, multi_head_attention_forward
    with in_proj = qkv_weight, gelu erf/tanh, softmax), for the two networks
    test_onnx_seq exports (told apart by their initializers);
  - onnxruntime on the file (the python of ORT_VENV_DIR, made by ort_setup.sh).
Exit 0: all passed; 1: a mismatch; 77: all that ran passed but torch or
onnxruntime was absent.
"""
import json
import os
import struct
import subprocess
import sys

import numpy as np
from onnx_wire import initializers

TOL = 1e-4


def float_initializers(path):
    """name -> float32 array of every FLOAT initializer (raw data, as clgrad writes them)."""
    return initializers(path, floats_only=True)


def twin(torch, w, ids, T):
    """The exported network recomputed in float64 from the initializers."""
    F = torch.nn.functional
    t = {k: torch.from_numpy(v.astype(np.float64)) for k, v in w.items()}
    x_ids = torch.from_numpy(ids.astype(np.int64))

    def ln(x, name, eps, affine=True):
        C = x.shape[-1]
        return F.layer_norm(x, (C,), t[name + ".gamma"] if affine else None, t[name + ".beta"] if affine else None, eps)

    def attn(x, name, heads, causal):
        T_, C = x.shape[1], x.shape[2]
        mask = torch.triu(torch.ones(T_, T_, dtype=torch.bool), 1) if causal else None
        xt = x.transpose(0, 1)  # (T, N, C)
        y, _ = F.multi_head_attention_forward(xt, xt, xt, C, heads, t[name + ".qkv_weight"], t[name + ".qkv_bias"],
                                              None, None, False, 0.0, t[name + ".out_weight"], t[name + ".out_bias"],
                                              training=False, need_weights=False, attn_mask=mask)
        return y.transpose(0, 1)

    if "tok.weight" in t:  # test_onnx_seq's gpt_model
        x = F.embedding(x_ids, t["tok.weight"]) + t["pos.weight"][:T]
        r1 = x + attn(ln(x, "ln1", 1e-5), "attn", 2, True)
        h = F.gelu(F.linear(ln(r1, "ln2", 1e-5), t["fc.weight"], t["fc.bias"]))
        r2 = r1 + F.linear(h, t["proj.weight"], t["proj.bias"])
        logits = F.linear(ln(r2, "ln_f", 1e-5), t["tok.weight"])
    else:  # other_model
        x = F.embedding(x_ids, t["emb.weight"]) + t["pe.weight"][:T]
        a = attn(ln(x, "ln", 1e-3, affine=False), "sa", 4, False)
        logits = F.linear(F.gelu(a, approximate="tanh"), t["out.weight"], t["out.bias"])
    return torch.softmax(logits, dim=-1).numpy()


def ort_python(venv):
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        r = subprocess.run(["sh", os.path.join(here, "ort_setup.sh"), venv], capture_output=True, text=True,
                           timeout=900)
    except subprocess.TimeoutExpired:
        return None
    if r.returncode != 0:
        print("note: " + (r.stderr.strip().splitlines() or ["ort_setup.sh failed"])[-1])
        return None
    return r.stdout.strip().splitlines()[-1]


def ort_run(py, model, ids, B, T):
    code = ("import sys, json, numpy as np, onnxruntime as ort\n"
            "x = np.fromfile(sys.argv[2], dtype='<f4').reshape(int(sys.argv[3]), 1, int(sys.argv[4]), 1)\n"
            "s = ort.InferenceSession(sys.argv[1], providers=['CPUExecutionProvider'])\n"
            "y = s.run(None, {s.get_inputs()[0].name: x})[0]\n"
            "print(json.dumps(y.astype(float).tolist()))\n")
    r = subprocess.run([py, "-c", code, model, ids, str(B), str(T)], capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise RuntimeError(f"onnxruntime: {r.stderr[-3000:]}")
    return np.array(json.loads(r.stdout), dtype=np.float64)


def main():
    model, ids_path, want_path, B, T, venv = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), \
        int(sys.argv[5]), sys.argv[6]
    ids = np.fromfile(ids_path, dtype="<f4").reshape(B, T)
    want = np.fromfile(want_path, dtype="<f4").astype(np.float64)
    fails, skipped = 0, False

    def report(name, got):
        nonlocal fails
        got = np.asarray(got, dtype=np.float64).reshape(-1)
        d = float(np.max(np.abs(got - want))) if got.shape == want.shape else float("inf")
        ok = d <= TOL
        print(f"{'ok  ' if ok else 'FAIL'} {name}: max |diff| {d:.2e} (tolerance {TOL:g}, B {B}, T {T}, "
              f"{got.size} vs {want.size} values)")
        fails += not ok

    try:
        import torch
        torch.set_num_threads(1)
        report("PyTorch twin from the exported initializers", twin(torch, float_initializers(model), ids, T))
    except ImportError:
        print("note: no torch under this python: the PyTorch twin is skipped")
        skipped = True
    py = ort_python(venv) if venv else None
    if py:
        report("onnxruntime", ort_run(py, model, ids_path, B, T))
    else:
        print("note: onnxruntime unavailable: its comparison is skipped")
        skipped = True
    return 1 if fails else (77 if skipped else 0)


if __name__ == "__main__":
    sys.exit(main())
