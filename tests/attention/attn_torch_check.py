#!/usr/bin/env python3
"""One [attention] layer against PyTorch: runs attn_torch_dump (the layer's
forward and backward on random inputs and parameters), recomputes the same
with torch.nn.functional.multi_head_attention_forward (in_proj_weight =
qkv_weight, out_proj = out_weight/out_bias, causal mask) and autograd in
float64, and compares the output, the input gradient and the four parameter
gradients: max |got - ref| / (|ref| + 1e-2) <= 1e-3.

    attn_torch_check.py DUMP_PROGRAM

Exit 77 (skip) without torch (Debian's python3-torch: /usr/bin/python3) or
without an OpenCL device."""
import os
import struct
import subprocess
import sys
import tempfile

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    print("skip: torch is not installed for", sys.executable)
    sys.exit(77)

TOL = 1e-3


def main():
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "attn.bin")
        rc = subprocess.run([sys.argv[1], out]).returncode
        if rc != 0:
            sys.exit(rc)
        data = open(out, "rb").read()
    N, T, C, heads, causal = struct.unpack_from("5i", data, 0)
    pos = 20

    def take(n, shape):
        nonlocal pos
        t = torch.tensor(struct.unpack_from("%df" % n, data, pos), dtype=torch.float64).reshape(shape)
        pos += 4 * n
        return t

    x = take(N * T * C, (N, T, C))
    wqkv, bqkv = take(3 * C * C, (3 * C, C)), take(3 * C, (3 * C,))
    wo, bo = take(C * C, (C, C)), take(C, (C,))
    dy = take(N * T * C, (N, T, C))
    got = {"y": take(N * T * C, (N, T, C)), "dx": take(N * T * C, (N, T, C)),
           "qkv_weight grad": take(3 * C * C, (3 * C, C)), "qkv_bias grad": take(3 * C, (3 * C,)),
           "out_weight grad": take(C * C, (C, C)), "out_bias grad": take(C, (C,))}
    assert pos == len(data), (pos, len(data))
    leaves = [t.requires_grad_() for t in (x, wqkv, bqkv, wo, bo)]
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), 1) if causal else None
    xt = x.transpose(0, 1)  # (T, N, C)
    y, _ = F.multi_head_attention_forward(xt, xt, xt, C, heads, wqkv, bqkv, None, None, False, 0.0, wo, bo,
                                          training=True, need_weights=False, attn_mask=mask)
    y = y.transpose(0, 1)
    y.backward(dy)
    ref = {"y": y.detach(), "dx": x.grad, "qkv_weight grad": wqkv.grad, "qkv_bias grad": bqkv.grad,
           "out_weight grad": wo.grad, "out_bias grad": bo.grad}
    bad = 0
    for k, r in ref.items():
        err = ((got[k] - r).abs() / (r.abs() + 1e-2)).max().item()
        ok = err <= TOL
        bad += not ok
        print("%-16s max error %.3g %s" % (k, err, "ok" if ok else "> %g" % TOL))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
