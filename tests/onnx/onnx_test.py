#!/usr/bin/python3
"""ONNX round trips (issue #15): run by meson with Debian's python3 (torch 1.13).

usage: onnx_test.py MODE CLGRAD SOURCE_ROOT [ORT_VENV_DIR]
  import    torch.onnx.export of LeNet-5 (several activations, input normalization,
            logits), VGG-S and resnet-mini (batch norm kept, and folded) with random
            weights -> `clgrad predict model.onnx --json` on float32 IDX inputs ->
            within TOL of PyTorch
  export    each shipped model briefly trained by clgrad -> `clgrad export` -> a PyTorch
            twin loaded from the exported initializers, onnxruntime (in ORT_VENV_DIR, made
            by ort_setup.sh from PyPI) and clgrad's re-import of its own export, all within
            TOL of `clgrad predict MODEL.cfg --weights W`; when onnxruntime cannot be had the
            other comparisons still run and the test then exits 77 (skip)
  errors    hostile / unsupported files are refused with the node, op type and opset named
            (unsupported operator, opset, external data, a recursion bomb, truncation, ...)
  finetune  a PyTorch-exported LeNet-5 (random weights) trained one epoch on a
            Fashion-MNIST subset: test accuracy must rise
Exit 0 pass, 1 fail, 77 skip (torch / the dataset / onnxruntime absent)."""
import json
import os
import struct
import subprocess
import sys
import tempfile

TOL = 1e-4
SKIP = 77

try:
    import numpy as np
    import torch
except ImportError as e:
    print(f"skip: {e} (PyTorch for {sys.executable}: Debian python3-torch)", file=sys.stderr)
    sys.exit(SKIP)

mode, clgrad, root = sys.argv[1], os.path.abspath(sys.argv[2]), sys.argv[3]
ort_venv = sys.argv[4] if len(sys.argv) > 4 else ""
sys.path.insert(0, os.path.join(root, "tests", "onnx"))
import torch_models as tm  # noqa: E402
from onnx_wire import initializers as onnx_initializers  # noqa: E402

torch.set_num_threads(1)
tmp = tempfile.mkdtemp(prefix="clgrad-onnx-")
fails = 0


def run(args, check=True):
    # one device: the kernels compile once (multi-device paths are the data-parallel tests' job)
    if args[0] in ("predict", "train", "eval", "export") and "--devices" not in args:
        args = args + ["--devices", os.environ.get("CLGRAD_ONNX_TEST_DEVICES", "0")]
    r = subprocess.run([clgrad] + args, capture_output=True, text=True, timeout=600)
    if check and r.returncode != 0:
        raise RuntimeError(f"clgrad {' '.join(args)} -> exit {r.returncode}:\n{r.stderr[-2000:]}")
    return r


def write_idx_f32(path, x):
    x = np.ascontiguousarray(x, dtype=">f4")
    with open(path, "wb") as f:
        f.write(struct.pack(">BBBB", 0, 0, 0x0D, x.ndim))
        f.write(struct.pack(">" + "I" * x.ndim, *x.shape))
        f.write(x.tobytes())


def predict(model, inp, weights=None):
    args = ["predict", model, "--input", inp, "--json"] + (["--weights", weights] if weights else [])
    out = run(args).stdout.splitlines()
    rows = [json.loads(l) for l in out if l.startswith("{")]
    assert [r["index"] for r in rows] == list(range(len(rows))), "indices out of order"
    for r in rows:
        assert r["class"] == int(np.argmax(r["probs"])), "class is not the argmax"
    return np.array([r["probs"] for r in rows], dtype=np.float64)


def report(name, got, want):
    global fails
    d = float(np.max(np.abs(got - want))) if got.shape == want.shape else float("inf")
    ok = d <= TOL
    print(f"{'ok  ' if ok else 'FAIL'} {name}: max |diff| {d:.2e} (tolerance {TOL:g}, {want.shape[0]} images)")
    if not ok:
        fails += 1


def inputs(seed, n=16):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, 1, 28, 28, generator=g)


# ---- minimal protobuf writing (hand-made hostile files) ----

def _vi(v):
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        out.append(b | (0x80 if v else 0))
        if not v:
            return bytes(out)


def pb_int(num, v):
    return _vi(num << 3) + _vi(v)


def pb_len(num, b):
    b = b.encode() if isinstance(b, str) else b
    return _vi(num << 3 | 2) + _vi(len(b)) + b


def value_info(name, dims):
    shape = b"".join(pb_len(1, pb_int(1, d)) for d in dims)
    return pb_len(1, name) + pb_len(2, pb_len(1, pb_int(1, 1) + pb_len(2, shape)))


def at_int(name, v, typ=2):
    """AttributeProto: INT (type 2) holding v in field i; typ lets a test lie about the type."""
    return pb_len(5, pb_len(1, name) + pb_int(20, typ) + pb_int(3, v & (2**64 - 1)))


def at_float(name, v, typ=1):
    return pb_len(5, pb_len(1, name) + pb_int(20, typ) + _vi(2 << 3 | 5) + struct.pack("<f", v))


def at_ints(name, vs, typ=7):
    return pb_len(5, pb_len(1, name) + pb_int(20, typ) + b"".join(pb_int(8, v & (2**64 - 1)) for v in vs))


def at_str(name, v, typ=3):
    return pb_len(5, pb_len(1, name) + pb_int(20, typ) + pb_len(4, v))


def model(nodes, inits=b"", opset=13, extra_graph=b""):
    graph = b"".join(pb_len(1, n) for n in nodes) + inits + pb_len(11, value_info("x", [1, 1, 4, 4])) + \
        pb_len(12, value_info("y", [1, 4])) + extra_graph
    return pb_int(1, 7) + pb_len(8, pb_int(2, opset)) + pb_len(7, graph)


def node(op, ins, outs, name="n", attrs=b""):
    return b"".join(pb_len(1, i) for i in ins) + b"".join(pb_len(2, o) for o in outs) + pb_len(3, name) + \
        pb_len(4, op) + attrs


# ---- modes ----

def mode_errors():
    global fails
    d = tmp

    def expect(desc, data, pattern, name="m.onnx", cmd="predict"):
        global fails
        f = os.path.join(d, name)
        open(f, "wb").write(data)
        xi = os.path.join(d, "x.idx")
        write_idx_f32(xi, np.zeros((1, 1, 4, 4), np.float32))
        args = ["predict", f, "--input", xi] if cmd == "predict" else ["export", f, "-o", os.path.join(d, "o.onnx")]
        r = run(args, check=False)
        ok = r.returncode == 1 and pattern in r.stderr
        print(f"{'ok  ' if ok else 'FAIL'} refused: {desc} (exit {r.returncode}): {r.stderr.strip()[-300:]}")
        fails += not ok

    w = struct.pack("<" + "f" * 64, *([0.1] * 64))
    init_w = pb_len(5, pb_int(1, 4) + pb_int(1, 16) + pb_int(2, 1) + pb_len(8, "w") + pb_len(9, w))
    gemm = node("Gemm", ["f", "w"], ["y"], "fc", pb_len(5, pb_len(1, "transB") + pb_int(20, 2) + pb_int(3, 1)))
    flat = node("Flatten", ["x"], ["f"], "flat")
    # a valid model first: the hand-made writer is right, so the refusals below are about what they change
    f = os.path.join(d, "ok.onnx")
    open(f, "wb").write(model([flat, gemm], init_w))
    xi = os.path.join(d, "x.idx")
    write_idx_f32(xi, np.random.rand(1, 1, 4, 4).astype(np.float32))
    got = predict(f, xi)
    xv = np.fromfile(xi, dtype=">f4", offset=20).astype(np.float64)
    logits = np.full(4, 0.1 * xv.sum())
    report("hand-made Flatten + Gemm model", got, (np.exp(logits) / np.exp(logits).sum())[None, :])
    expect("unsupported operator names node, op type and opset",
           model([node("HardSwish", ["x"], ["h"], "my_hswish"), node("Flatten", ["h"], ["f"], "flat"), gemm], init_w),
           "node 'my_hswish' (HardSwish, opset 13)")
    expect("opset outside the supported range", model([flat, gemm], init_w, opset=99), "opset 99")
    ext = pb_len(5, pb_int(1, 4) + pb_int(1, 16) + pb_int(2, 1) + pb_len(8, "w") +
                 pb_len(13, pb_len(1, "location") + pb_len(2, "../../etc/passwd")) + pb_int(14, 1))
    expect("external tensor data", model([flat, gemm], ext), "external")
    # a recursion bomb: attributes holding graphs holding nodes holding attributes ...
    inner = b""
    for _ in range(2000):
        inner = pb_len(5, pb_len(1, "g") + pb_len(6, pb_len(1, node("If", [], ["o"], "i", inner))))
    expect("messages nested 6000 deep", model([flat, gemm], init_w, extra_graph=pb_len(1, inner)), "nested deeper")
    good = model([flat, gemm], init_w)
    expect("truncated file", good[:-7], "not a valid ONNX")
    expect("weights of the wrong size", model([flat, gemm], pb_len(5, pb_int(1, 4) + pb_int(1, 16) + pb_int(2, 1) +
                                                                     pb_len(8, "w") + pb_len(9, w[:-4]))), "raw bytes")
    expect("a .onnx file that is not ONNX", b"\x00garbage\xff" * 10, "ONNX", name="junk.onnx")
    expect("two graph outputs", model([flat, gemm], init_w, extra_graph=pb_len(12, value_info("f", [1, 16]))),
           "outputs")
    attribute_errors(expect, w, init_w, flat, xi)
    sequence_errors(expect, w, init_w, flat, gemm)
    r = run(["export", os.path.join(root, "models", "lenet5.cfg"), "--weights", os.path.join(d, "none.safetensors"),
             "-o", os.path.join(d, "o.onnx")], check=False)
    ok = r.returncode == 1
    print(f"{'ok  ' if ok else 'FAIL'} export without a readable weights file fails (exit {r.returncode})")
    fails += not ok
    r = run(["predict", os.path.join(root, "models", "lenet5.cfg"), "--input", xi], check=False)
    ok = r.returncode == 2 and "missing --weights" in r.stderr
    print(f"{'ok  ' if ok else 'FAIL'} predict of a model file without --weights is a usage error (exit {r.returncode})")
    fails += not ok


def attribute_errors(expect, w, init_w, flat, xi):
    """Issue 26 item 6: every attribute's type and range is checked against the operator's definition; the
    refusal names the node, the attribute and what it should be."""
    global fails
    def gemm(attrs):
        return node("Gemm", ["f", "w"], ["y"], "fc", attrs)
    expect("Gemm transB = 2", model([flat, gemm(at_int("transB", 2))], init_w),
           "node 'fc' (Gemm, opset 13): attribute transB = 2 is outside [0, 1]")
    expect("Gemm transB given as a FLOAT", model([flat, gemm(at_float("transB", 1.0))], init_w),
           "attribute transB is FLOAT; the operator defines it as INT")
    expect("Gemm transB typed INT without a value", model([flat, gemm(pb_len(5, pb_len(1, "transB") + pb_int(20, 2)))],
                                                          init_w), "attribute transB is typed INT but holds no value")
    expect("Gemm alpha = nan", model([flat, gemm(at_int("transB", 1) + at_float("alpha", float("nan")))], init_w),
           "attribute alpha = nan is not a finite FLOAT")
    expect("Gemm alpha given as INTS", model([flat, gemm(at_int("transB", 1) + at_ints("alpha", [1]))], init_w),
           "attribute alpha is INTS; the operator defines it as FLOAT")
    expect("Flatten axis given as a STRING", model([node("Flatten", ["x"], ["f"], "flat", at_str("axis", "1")),
                                                    gemm(at_int("transB", 1))], init_w),
           "node 'flat' (Flatten, opset 13): attribute axis is STRING; the operator defines it as INT")
    # Conv: 4 filters of 1x4x4 over the 1x4x4 input, then Flatten to the 1x4 output
    init_c = pb_len(5, pb_int(1, 4) + pb_int(1, 1) + pb_int(1, 4) + pb_int(1, 4) + pb_int(2, 1) + pb_len(8, "wc") +
                    pb_len(9, w))
    def conv(attrs):
        return model([node("Conv", ["x", "wc"], ["c"], "conv", attrs), node("Flatten", ["c"], ["y"], "flat")], init_c)
    f = os.path.join(tmp, "conv_ok.onnx")
    open(f, "wb").write(conv(at_int("group", 1) + at_ints("strides", [1, 1]) + at_ints("kernel_shape", [4, 4]) +
                             at_str("auto_pad", "NOTSET")))
    got = predict(f, xi)
    xv = np.fromfile(xi, dtype=">f4", offset=20).astype(np.float64)
    logits = np.full(4, 0.1 * xv.sum())
    report("hand-made Conv + Flatten model (the attributes below are what changes)", got,
           (np.exp(logits) / np.exp(logits).sum())[None, :])
    cases = [("Conv group = 1.5 (a FLOAT)", at_float("group", 1.5), "attribute group is FLOAT; the operator defines it as INT"),
             ("Conv group = 0", at_int("group", 0), "attribute group = 0 is outside [1, "),
             ("Conv group = -1", at_int("group", -1), "attribute group = -1 is outside"),
             ("Conv strides given as an INT", at_int("strides", 1), "attribute strides is INT; the operator defines it as INTS"),
             ("Conv strides = 0", at_ints("strides", [0, 0]), "attribute strides = 0 is outside"),
             ("Conv dilations = -1", at_ints("dilations", [-1, -1]), "attribute dilations = -1 is outside"),
             ("Conv kernel_shape given as FLOATS", pb_len(5, pb_len(1, "kernel_shape") + pb_int(20, 6) +
                                                          _vi(7 << 3 | 5) + struct.pack("<f", 4)),
              "attribute kernel_shape is FLOATS; the operator defines it as INTS"),
             ("Conv pads = -1", at_ints("pads", [-1, -1, -1, -1]), "attribute pads = -1 is outside"),
             ("Conv auto_pad given as an INT", at_int("auto_pad", 0), "attribute auto_pad is INT; the operator defines it as STRING"),
             ("Conv group given as a STRING", at_str("group", "1"), "attribute group is STRING")]
    for desc, attrs, pattern in cases:
        expect(desc, conv(attrs), "node 'conv' (Conv, opset 13): " + pattern)


def sequence_errors(expect, w, init_w, flat, gemm):
    """The sequence operators outside the patterns clgrad's export writes (issue 23): refused, naming the node."""
    init_s = pb_len(5, pb_int(1, 4) + pb_int(2, 1) + pb_len(8, "s") + pb_len(9, struct.pack("<4f", 1, 1, 1, 1)))
    init_t = pb_len(5, pb_int(1, 16) + pb_int(1, 4) + pb_int(2, 1) + pb_len(8, "t") + pb_len(9, w))
    expect("a Gather that is not an embedding's Reshape + Cast + Gather",
           model([node("Gather", ["t", "x"], ["g"], "lone_gather"), node("Flatten", ["g"], ["f"], "flat"), gemm],
                 init_w + init_t, opset=17), "node 'lone_gather' (Gather, opset 17): unsupported operator")
    expect("LayerNormalization of an image, not a sequence",
           model([node("LayerNormalization", ["x", "s"], ["l"], "ln_img"), node("Flatten", ["l"], ["f"], "flat"),
                  gemm], init_w + init_s, opset=17), "node 'ln_img' (LayerNormalization, opset 17): only a layer norm")
    expect("a Mul outside a GELU pattern",
           model([node("Mul", ["x", "x"], ["m"], "square"), node("Flatten", ["m"], ["f"], "flat"), gemm], init_w,
                 opset=17), "node 'square' (Mul, opset 17): Mul is supported only within a GELU")
    expect("a Slice that is not a position table added to a sequence",
           model([node("Slice", ["t", "x", "x"], ["sl"], "cut"), flat, gemm], init_w + init_t, opset=17),
           "node 'cut' (Slice, opset 17): only the slice of a position table")


def mode_import():
    norm = ([0.2860], [0.3530])
    cases = [
        ("lenet5 relu + softmax", tm.LeNet5(), {}),
        ("lenet5 input normalization (Sub/Div)", tm.LeNet5(norm=norm), {}),
        ("lenet5 logits (softmax appended)", tm.LeNet5(softmax=False), {}),
        ("lenet5 gelu (erf form)", tm.LeNet5(act=torch.nn.GELU), {}),
        ("lenet5 leaky relu", tm.LeNet5(act=lambda: torch.nn.LeakyReLU(0.1)), {}),
        ("lenet5 tanh", tm.LeNet5(act=torch.nn.Tanh), {}),
        ("lenet5 sigmoid", tm.LeNet5(act=torch.nn.Sigmoid), {}),
        ("vgg-s", tm.VGGS(), {}),
        ("resnet-mini (batch norm folded by the exporter)", tm.ResNetMini(), {}),
        ("resnet-mini (BatchNormalization kept)", tm.ResNetMini(),
         dict(training=torch.onnx.TrainingMode.PRESERVE, do_constant_folding=False)),
        ("branching graph (Concat, Pad into AveragePool, Transpose + MatMul)", tm.Branch(),
         dict(training=torch.onnx.TrainingMode.PRESERVE, do_constant_folding=False)),
        ("lenet5 opset 9, input normalization", tm.LeNet5(norm=norm), dict(opset_version=9)),
        ("resnet-mini opset 17", tm.ResNetMini(), dict(opset_version=17)),
    ]
    for i, (name, m, kw) in enumerate(cases):
        m.eval()
        tm.randomize(m, torch.Generator().manual_seed(100 + i))
        x = inputs(200 + i)
        f = os.path.join(tmp, f"m{i}.onnx")
        kw = dict(kw)
        torch.onnx.export(m, x[:1], f, input_names=["input"], output_names=["output"],
                          opset_version=kw.pop("opset_version", 13),
                          dynamic_axes={"input": {0: "N"}, "output": {0: "N"}}, **kw)
        with torch.no_grad():
            want = m(x).double()
        if not m.softmax:
            want = torch.softmax(want, 1)
        xi = os.path.join(tmp, f"x{i}.idx")
        write_idx_f32(xi, x.numpy())
        got = predict(f, xi)  # no --weights: they come with the ONNX file
        report("import " + name, got, want.numpy())


def data_dir():
    for d in (os.environ.get("CLGRAD_DATA_DIR", ""), "/usr/share/datasets"):
        p = os.path.join(d, "fashion-mnist")
        if d and os.path.exists(os.path.join(p, "train-images-idx3-ubyte.gz")):
            return p
    return None


def ort_run(model, inp):
    code = ("import sys, json, struct, numpy as np, onnxruntime as ort\n"
            "b = open(sys.argv[2], 'rb').read(); nd = b[3]\n"
            "dims = struct.unpack('>' + 'I' * nd, b[4:4 + 4 * nd])\n"
            "x = np.frombuffer(b[4 + 4 * nd:], dtype='>f4').astype(np.float32).reshape(dims)\n"
            "s = ort.InferenceSession(sys.argv[1], providers=['CPUExecutionProvider'])\n"
            "y = s.run(None, {s.get_inputs()[0].name: x})[0]\n"
            "print(json.dumps(y.astype(float).tolist()))\n")
    r = subprocess.run([ort_python, "-c", code, model, inp], capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise RuntimeError(f"onnxruntime: {r.stderr[-2000:]}")
    return np.array(json.loads(r.stdout), dtype=np.float64)


def mode_export():
    global fails
    dd = data_dir()
    if not dd:
        print("skip: Fashion-MNIST not found (Debian dataset-fashion-mnist)", file=sys.stderr)
        sys.exit(SKIP)
    global ort_python
    ort_python, have_ort = "", False
    if ort_venv:
        r = subprocess.run(["sh", os.path.join(root, "tests", "onnx", "ort_setup.sh"), ort_venv],
                           capture_output=True, text=True, timeout=900)
        have_ort = r.returncode == 0
        ort_python = r.stdout.strip().splitlines()[-1] if have_ort else ""
        if not have_ort:
            print("note: " + (r.stderr.strip().splitlines() or ["ort_setup.sh failed"])[-1])
    if not have_ort:
        print("note: onnxruntime unavailable: its comparisons are skipped (the test exits 77 if all else passes)")
    for i, (name, cls) in enumerate(tm.MODELS.items()):
        cfg = os.path.join(root, "models", name + ".cfg")
        w = os.path.join(tmp, name + ".safetensors")
        # a short real training run: weights away from their initialisation, the input normalization computed
        run(["train", cfg, "--data", dd, "--epochs", "1", "--limit-train", "128", "--limit-test", "16",
             "--batch", "32", "--lr", "0.01", "--save", w])
        f = os.path.join(tmp, name + ".onnx")
        run(["export", cfg, "--weights", w, "-o", f])
        x = inputs(300 + i)
        xi = os.path.join(tmp, f"e{i}.idx")
        write_idx_f32(xi, x.numpy())
        want = predict(cfg, xi, w)
        inits = onnx_initializers(f)
        twin = cls(norm=([0.0], [1.0]))
        twin.eval()
        nloaded = tm.load_clgrad(twin, inits)
        expect = len([k for k in twin.state_dict() if not k.startswith("norm.") and "num_batches" not in k])
        if nloaded != expect:
            print(f"FAIL export {name}: {nloaded} of {expect} PyTorch tensors found among the initializers")
            fails += 1
            continue
        with torch.no_grad():
            tw = twin(x).double().numpy()
        report(f"export {name}: PyTorch twin from the exported initializers", tw, want)
        report(f"export {name}: clgrad re-import of its own export", predict(f, xi), want)
        if have_ort:
            report(f"export {name}: onnxruntime", ort_run(f, xi), want)
    return None if have_ort else SKIP


def eval_acc(model, dd, weights=None):
    r = run(["eval", model, "--data", dd, "--limit", "1000"] + (["--weights", weights] if weights else []))
    for line in r.stdout.splitlines():
        if line.startswith("accuracy"):
            return float(line.split()[1].rstrip("%")) / 100
    raise RuntimeError("no accuracy in eval output:\n" + r.stdout)


def mode_finetune():
    global fails
    dd = data_dir()
    if not dd:
        print("skip: Fashion-MNIST not found (Debian dataset-fashion-mnist)", file=sys.stderr)
        sys.exit(SKIP)
    m = tm.LeNet5(norm=([0.2860], [0.3530]))
    m.eval()
    tm.randomize(m, torch.Generator().manual_seed(7))
    f = os.path.join(tmp, "lenet5.onnx")
    torch.onnx.export(m, inputs(1, 1), f, input_names=["input"], output_names=["output"], opset_version=13,
                      dynamic_axes={"input": {0: "N"}, "output": {0: "N"}})
    before = eval_acc(f, dd)
    w = os.path.join(tmp, "tuned.safetensors")
    run(["train", f, "--data", dd, "--epochs", "1", "--limit-train", "4096", "--limit-test", "16", "--batch", "64",
         "--lr", "0.02", "--save", w])
    after = eval_acc(f, dd, w)
    ok = after > before + 0.2
    print(f"{'ok  ' if ok else 'FAIL'} fine-tune imported LeNet-5, 1 epoch on 4096 Fashion-MNIST images: "
          f"test accuracy (1000 images) {100 * before:.1f}% -> {100 * after:.1f}% (must rise by 20 points)")
    fails += not ok


ort_python = ""
rc = None
try:
    rc = {"import": mode_import, "export": mode_export, "finetune": mode_finetune, "errors": mode_errors}[mode]()
except (RuntimeError, AssertionError) as e:
    print(f"FAIL: {e}")
    fails += 1
finally:
    subprocess.run(["rm", "-rf", tmp])
sys.exit(1 if fails else rc or 0)
