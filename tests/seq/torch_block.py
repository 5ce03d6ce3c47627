#!/usr/bin/python3
"""PyTorch reference for tests/seq/test_seq_torch.c (issue 23's whole block).

Reads IN (written by the C test): the shapes, token ids, int32 targets and
every parameter of the block; builds the same network in float64:

    x = tok[ids] + pos[:T]; h = ln1(x); s = h + fc2(gelu(fc1(h))) (erf GELU);
    z = ln2(s); logits = z @ tok^T + head_bias  (the head tied to tok);
    loss = cross_entropy(logits, targets), mean over N*T positions

and writes OUT: the loss and every gradient at the start, then the loss and
parameters after each of two AdamW steps (torch.optim.AdamW, every
parameter decayed, as clgrad's optimizer does). Exit 77 without torch.
Usage: /usr/bin/python3 torch_block.py IN OUT
"""
import struct
import sys

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    sys.exit(77)


def main(src, dst):
    with open(src, "rb") as f:
        data = f.read()
    off = 0

    def take(fmt):
        nonlocal off
        vals = struct.unpack_from(fmt, data, off)
        off += struct.calcsize(fmt)
        return vals

    N, T, V, D, H, CTX, NP = take("<7i")
    lr, b1, b2, eps, wd, ln_eps = take("<6d")
    ids = torch.tensor(take("<%df" % (N * T)), dtype=torch.float64).view(N, T).long()
    tgt = torch.tensor(take("<%di" % (N * T)), dtype=torch.int64).view(N * T)
    names, params = [], {}
    for _ in range(NP):
        (ln,) = take("<i")
        name = data[off:off + ln].decode()
        off += ln
        (numel,) = take("<i")
        vals = torch.tensor(take("<%df" % numel), dtype=torch.float64)
        names.append(name)
        params[name] = vals.clone().requires_grad_(True)
    p = params
    shape = {
        "tok.weight": (V, D), "pos.weight": (CTX, D), "fc1.weight": (H, D), "fc2.weight": (D, H),
    }

    def P(name):
        t = p[name]
        return t.view(shape[name]) if name in shape else t

    def loss_fn():
        x = P("tok.weight")[ids] + P("pos.weight")[:T].unsqueeze(0)
        h = F.layer_norm(x, (D,), P("ln1.gamma"), P("ln1.beta"), ln_eps)
        a = F.linear(F.gelu(F.linear(h, P("fc1.weight"), P("fc1.bias"))), P("fc2.weight"), P("fc2.bias"))
        z = F.layer_norm(h + a, (D,), P("ln2.gamma"), P("ln2.beta"), ln_eps)
        logits = F.linear(z, P("tok.weight"), P("head.bias"))
        return F.cross_entropy(logits.reshape(N * T, V), tgt)

    opt = torch.optim.AdamW([p[n] for n in names], lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd)
    out = []
    loss = loss_fn()
    loss.backward()
    out.append(struct.pack("<d", loss.item()))
    for n in names:
        g = p[n].grad
        out.append(struct.pack("<%dd" % g.numel(), *g.tolist()))
    for _ in range(2):
        opt.step()
        opt.zero_grad()
        loss = loss_fn()
        loss.backward()
        out.append(struct.pack("<d", loss.item()))
        for n in names:
            out.append(struct.pack("<%dd" % p[n].numel(), *p[n].detach().tolist()))
    with open(dst, "wb") as f:
        f.write(b"".join(out))


if __name__ == "__main__":
    torch.set_default_dtype(torch.float64)
    main(sys.argv[1], sys.argv[2])
