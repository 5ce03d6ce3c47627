#!/usr/bin/python3
"""Writes PyTorch reference dumps for the layer tests (tests/model/test_torch.c).

Usage: /usr/bin/python3 tests/model/gen_torch_dumps.py OUTDIR

One file per case, OUTDIR/<case>.bin, little-endian:
  b"CLGT" u32 version(1)
  str type, str keys            (str = u32 length + bytes)
  u32 nin, nin x 4 x i32 input shapes (N, C, H, W)
  u32 ntensors, then per tensor: str name, u32 ndim, ndim x i32 dims,
  prod(dims) x f32 data
Tensor names: x0.. (inputs), p:<param> (initial parameter values, in the
layer's order), dout, labels (class ids as f32) / targets, then the results
y, dx0.., g:<param>, loss (mean over the batch), and for batchnorm
s:running_mean / s:running_var after the forward.

The inputs are float32 values; PyTorch computes in float64 from them, so the
references are exact up to float64 rounding. Fixed seeds: the output is the
same on every run. Exits 77 when torch is unavailable.
"""
import os
import struct
import sys

try:
    import torch
    import torch.nn.functional as F
except Exception as e:  # pragma: no cover
    print("torch unavailable: %s" % e, file=sys.stderr)
    sys.exit(77)

torch.set_default_dtype(torch.float64)


def wstr(f, s):
    b = s.encode()
    f.write(struct.pack("<I", len(b)))
    f.write(b)


def wtensor(f, name, t):
    t = t.detach().to(torch.float32).contiguous()
    wstr(f, name)
    f.write(struct.pack("<I", t.dim()))
    for d in t.shape:
        f.write(struct.pack("<i", d))
    f.write(t.numpy().astype("<f4").tobytes())


def rnd(g, *shape, lo=-1.0, hi=1.0):
    # float32-representable values, then promoted to float64
    t = torch.rand(*shape, generator=g, dtype=torch.float32) * (hi - lo) + lo
    return t.to(torch.float64)


ACT = {
    "linear": lambda z: z,
    "relu": F.relu,
    "leaky": lambda z: F.leaky_relu(z, 0.01),
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
    "gelu": F.gelu,  # exact erf form
}


def dump(outdir, case, ltype, keys, xs, params, dout, results, extra_in=()):
    path = os.path.join(outdir, case + ".bin")
    with open(path, "wb") as f:
        f.write(b"CLGT")
        f.write(struct.pack("<I", 1))
        wstr(f, ltype)
        wstr(f, keys)
        f.write(struct.pack("<I", len(xs)))
        for x in xs:
            s = list(x.shape) + [1] * (4 - x.dim())
            f.write(struct.pack("<4i", *s))
        tensors = []
        for i, x in enumerate(xs):
            tensors.append(("x%d" % i, x))
        for name, p in params:
            tensors.append(("p:" + name, p))
        for name, t in extra_in:
            tensors.append((name, t))
        if dout is not None:
            tensors.append(("dout", dout))
        tensors += results
        f.write(struct.pack("<I", len(tensors)))
        for name, t in tensors:
            wtensor(f, name, t)


def leaf(t):
    return t.clone().requires_grad_(True)


def conv_cases(outdir, g):
    specs = [
        # name, N C H W, K R S, stride pad dil groups bias act
        ("conv3x3_relu", (2, 3, 8, 8), (4, 3, 3), 1, 1, 1, 1, 1, "relu"),
        ("conv5x5_valid", (2, 1, 12, 12), (6, 5, 5), 1, 0, 1, 1, 1, "relu"),
        ("conv_s2_groups_tanh", (2, 4, 9, 7), (6, 3, 3), 2, 1, 1, 2, 1, "tanh"),
        ("conv_dil_gelu_nobias", (2, 3, 9, 9), (4, 3, 3), 1, 2, 2, 1, 0, "gelu"),
        ("conv_depthwise_leaky", (2, 4, 6, 6), (4, 3, 3), 1, 1, 1, 4, 1, "leaky"),
        ("conv1x1_sigmoid", (3, 5, 4, 4), (3, 1, 1), 1, 0, 1, 1, 1, "sigmoid"),
    ]
    for name, (N, C, H, W), (K, R, S), st, pad, dil, grp, bias, act in specs:
        x = leaf(rnd(g, N, C, H, W))
        w = leaf(rnd(g, K, C // grp, R, S, lo=-0.5, hi=0.5))
        b = leaf(rnd(g, K, lo=-0.3, hi=0.3)) if bias else None
        y = ACT[act](F.conv2d(x, w, b, stride=st, padding=pad, dilation=dil, groups=grp))
        dout = rnd(g, *y.shape)
        y.backward(dout)
        keys = "filters=%d size=%d stride=%d pad=%d dilation=%d groups=%d bias=%d activation=%s" % (
            K, R, st, pad, dil, grp, bias, act)
        params = [("weight", w.detach())] + ([("bias", b.detach())] if bias else [])
        res = [("y", y), ("dx0", x.grad), ("g:weight", w.grad)] + ([("g:bias", b.grad)] if bias else [])
        dump(outdir, name, "convolutional", keys, [x.detach()], params, dout, res)


def dense_cases(outdir, g):
    specs = [("dense_relu", (4, 3, 2, 2), 7, 1, "relu"), ("dense_linear_nobias", (5, 10, 1, 1), 4, 0, "linear"),
             ("dense_gelu", (3, 2, 3, 3), 6, 1, "gelu"), ("dense_sigmoid", (4, 6, 1, 1), 5, 1, "sigmoid")]
    for name, shp, units, bias, act in specs:
        x = leaf(rnd(g, *shp))
        fin = shp[1] * shp[2] * shp[3]
        w = leaf(rnd(g, units, fin, lo=-0.5, hi=0.5))
        b = leaf(rnd(g, units, lo=-0.3, hi=0.3)) if bias else None
        y = ACT[act](F.linear(x.flatten(1), w, b)).reshape(shp[0], units, 1, 1)
        dout = rnd(g, *y.shape)
        y.backward(dout)
        keys = "units=%d bias=%d activation=%s" % (units, bias, act)
        params = [("weight", w.detach())] + ([("bias", b.detach())] if bias else [])
        res = [("y", y), ("dx0", x.grad), ("g:weight", w.grad)] + ([("g:bias", b.grad)] if bias else [])
        dump(outdir, name, "dense", keys, [x.detach()], params, dout, res)


def pool_cases(outdir, g):
    specs = [("maxpool2", "maxpool", (2, 3, 8, 6), 2, 2, 0), ("maxpool3s2p1", "maxpool", (2, 2, 9, 7), 3, 2, 1),
             ("avgpool2", "avgpool", (2, 3, 8, 6), 2, 2, 0), ("avgpool3s2p1", "avgpool", (2, 2, 9, 7), 3, 2, 1),
             ("maxpool2_relu_ties", "maxpool", (2, 3, 6, 6), 2, 2, 0)]
    for name, t, shp, k, st, pad in specs:
        x0 = rnd(g, *shp)
        if "ties" in name:
            x0 = torch.clamp(x0, min=0.0)  # many exact zeros: first max wins
        x = leaf(x0)
        if t == "maxpool":
            y = F.max_pool2d(x, k, st, pad)
        else:
            y = F.avg_pool2d(x, k, st, pad, count_include_pad=True)
        dout = rnd(g, *y.shape)
        y.backward(dout)
        dump(outdir, name, t, "size=%d stride=%d pad=%d" % (k, st, pad), [x.detach()], [], dout,
             [("y", y), ("dx0", x.grad)])
    x = leaf(rnd(g, 3, 5, 4, 6))
    y = F.adaptive_avg_pool2d(x, 1)
    dout = rnd(g, *y.shape)
    y.backward(dout)
    dump(outdir, "gap", "gap", "", [x.detach()], [], dout, [("y", y), ("dx0", x.grad)])


def act_cases(outdir, g):
    for t in ["relu", "leaky", "sigmoid", "tanh", "gelu"]:
        x = leaf(rnd(g, 2, 3, 4, 5, lo=-3, hi=3))
        alpha = 0.05
        y = F.leaky_relu(x, alpha) if t == "leaky" else ACT[t](x)
        dout = rnd(g, *y.shape)
        y.backward(dout)
        dump(outdir, "act_" + t, "activation", "type=%s alpha=%g" % (t, alpha), [x.detach()], [], dout,
             [("y", y), ("dx0", x.grad)])


def bn_cases(outdir, g):
    for name, shp in [("bn2d", (4, 3, 5, 5)), ("bn1d", (8, 6, 1, 1))]:
        C = shp[1]
        x = leaf(rnd(g, *shp, lo=-1, hi=3))
        gamma = leaf(rnd(g, C, lo=0.5, hi=1.5))
        beta = leaf(rnd(g, C, lo=-0.5, hi=0.5))
        rm = rnd(g, C, lo=-0.2, hi=0.2)
        rv = rnd(g, C, lo=0.5, hi=2.0)
        rm_after, rv_after = rm.clone(), rv.clone()
        y = F.batch_norm(x, rm_after, rv_after, gamma, beta, training=True, momentum=0.2, eps=1e-4)
        dout = rnd(g, *y.shape)
        y.backward(dout)
        params = [("gamma", gamma.detach()), ("beta", beta.detach()), ("running_mean", rm), ("running_var", rv)]
        res = [("y", y), ("dx0", x.grad), ("g:gamma", gamma.grad), ("g:beta", beta.grad),
               ("s:running_mean", rm_after), ("s:running_var", rv_after)]
        dump(outdir, name, "batchnorm", "eps=1e-4 momentum=0.2", [x.detach()], params, dout, res)
        # inference mode with the updated running statistics
        xi = leaf(x.detach())
        yi = F.batch_norm(xi, rm_after.clone(), rv_after.clone(), gamma.detach(), beta.detach(), training=False,
                          eps=1e-4)
        params_i = [("gamma", gamma.detach()), ("beta", beta.detach()), ("running_mean", rm_after),
                    ("running_var", rv_after)]
        dump(outdir, name + "_infer", "batchnorm", "eps=1e-4 momentum=0.2", [x.detach()], params_i, None,
             [("y_infer", yi)])


def struct_cases(outdir, g):
    xs = [leaf(rnd(g, 3, 4, 3, 3)) for _ in range(3)]
    y = xs[0] + xs[1] + xs[2]
    dout = rnd(g, *y.shape)
    y.backward(dout)
    dump(outdir, "add3", "add", "", [x.detach() for x in xs], [], dout,
         [("y", y)] + [("dx%d" % i, x.grad) for i, x in enumerate(xs)])
    xs = [leaf(rnd(g, 2, c, 3, 4)) for c in (2, 5, 1)]
    y = torch.cat(xs, dim=1)
    dout = rnd(g, *y.shape)
    y.backward(dout)
    dump(outdir, "concat3", "concat", "", [x.detach() for x in xs], [], dout,
         [("y", y)] + [("dx%d" % i, x.grad) for i, x in enumerate(xs)])
    x = leaf(rnd(g, 3, 2, 3, 4))
    y = x.flatten(1).reshape(3, 24, 1, 1)
    dout = rnd(g, *y.shape)
    y.backward(dout)
    dump(outdir, "flatten", "flatten", "", [x.detach()], [], dout, [("y", y), ("dx0", x.grad)])


def loss_cases(outdir, g):
    for name, N, C in [("softmax10", 8, 10), ("softmax100", 5, 100)]:
        x = leaf(rnd(g, N, C, 1, 1, lo=-4, hi=4))
        labels = torch.randint(0, C, (N,), generator=g)
        logits = x.flatten(1)
        loss = F.cross_entropy(logits, labels)  # mean over the batch
        loss.backward()
        p = F.softmax(logits, dim=1).reshape(N, C, 1, 1)
        dump(outdir, name, "softmax", "", [x.detach()], [], None,
             [("y", p), ("dx0", x.grad), ("loss", loss.reshape(1))],
             extra_in=[("labels", labels.to(torch.float64))])
    x = leaf(rnd(g, 4, 3, 2, 2, lo=-2, hi=2))
    t = rnd(g, 4, 3, 2, 2, lo=-2, hi=2)
    loss = F.mse_loss(x, t)  # mean over every element
    loss.backward()
    dump(outdir, "mse", "mse", "", [x.detach()], [], None, [("y", x.detach()), ("dx0", x.grad),
                                                            ("loss", loss.reshape(1))], extra_in=[("targets", t)])


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    outdir = sys.argv[1]
    os.makedirs(outdir, exist_ok=True)
    g = torch.Generator().manual_seed(20240501)
    conv_cases(outdir, g)
    dense_cases(outdir, g)
    pool_cases(outdir, g)
    act_cases(outdir, g)
    bn_cases(outdir, g)
    struct_cases(outdir, g)
    loss_cases(outdir, g)
    with open(os.path.join(outdir, "VERSION"), "w") as f:
        f.write("torch %s\n" % torch.__version__)
    return 0


if __name__ == "__main__":
    sys.exit(main())
