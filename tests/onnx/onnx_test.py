#!/usr/bin/python3
"""ONNX round trips (issue #15): run by meson with Debian's python3 (torch 1.13).

usage: onnx_test.py MODE CLGRAD SOURCE_ROOT [ORT_PYTHON]
  import    torch.onnx.export of LeNet-5 (several activations, input normalization,
            logits), VGG-S and resnet-mini (batch norm kept, and folded) with random
            weights -> `clgrad predict model.onnx --json` on float32 IDX inputs ->
            within TOL of PyTorch
  export    each shipped model briefly trained by clgrad -> `clgrad export` -> a PyTorch
            twin loaded from the exported initializers, onnxruntime (ORT_PYTHON, a venv
            made by ort_setup.sh; skipped when absent) and clgrad's re-import of its own
            export, all within TOL of `clgrad predict MODEL.cfg --weights W`
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
ort_python = sys.argv[4] if len(sys.argv) > 4 else ""
sys.path.insert(0, os.path.join(root, "tests", "onnx"))
import torch_models as tm  # noqa: E402

torch.set_num_threads(1)
tmp = tempfile.mkdtemp(prefix="clgrad-onnx-")
fails = 0


def run(args, check=True):
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


# ---- minimal protobuf reading: the initializers of an ONNX file (no onnx package needed) ----

def _varint(b, i):
    r = s = 0
    while True:
        c = b[i]
        i += 1
        r |= (c & 0x7F) << s
        s += 7
        if not c & 0x80:
            return r, i


def _fields(b):
    i = 0
    while i < len(b):
        key, i = _varint(b, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, i = _varint(b, i)
        elif wt == 1:
            v, i = b[i:i + 8], i + 8
        elif wt == 5:
            v, i = b[i:i + 4], i + 4
        elif wt == 2:
            n, i = _varint(b, i)
            v, i = b[i:i + n], i + n
        else:
            raise ValueError(f"wire type {wt}")
        yield num, wt, v


def onnx_initializers(path):
    data = open(path, "rb").read()
    graph = next(v for n, w, v in _fields(data) if n == 7)
    out = {}
    for n, w, t in _fields(graph):
        if n != 5:
            continue
        dims, name, raw, floats, dtype = [], None, None, [], None
        for fn, fw, v in _fields(t):
            if fn == 1:
                if fw == 0:
                    dims.append(v)
                else:
                    j = 0
                    while j < len(v):
                        d, j = _varint(v, j)
                        dims.append(d)
            elif fn == 2:
                dtype = v
            elif fn == 8:
                name = v.decode()
            elif fn == 9:
                raw = v
            elif fn == 4:
                floats.extend(struct.unpack("<" + "f" * (len(v) // 4), v) if fw == 2 else struct.unpack("<f", v))
        assert dtype == 1, f"initializer {name}: data type {dtype}"
        arr = np.frombuffer(raw, dtype="<f4") if raw is not None else np.array(floats, dtype=np.float32)
        out[name] = arr.astype(np.float32).reshape(dims)
    return out


# ---- modes ----

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
    ]
    for i, (name, m, kw) in enumerate(cases):
        m.eval()
        tm.randomize(m, torch.Generator().manual_seed(100 + i))
        x = inputs(200 + i)
        f = os.path.join(tmp, f"m{i}.onnx")
        torch.onnx.export(m, x[:1], f, input_names=["input"], output_names=["output"], opset_version=13,
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
    have_ort = bool(ort_python) and subprocess.run([ort_python, "-c", "import onnxruntime"],
                                                   capture_output=True).returncode == 0
    if not have_ort:
        print("note: onnxruntime unavailable (tests/onnx/ort_setup.sh found no venv): ORT comparisons skipped")
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


try:
    {"import": mode_import, "export": mode_export, "finetune": mode_finetune}[mode]()
except (RuntimeError, AssertionError) as e:
    print(f"FAIL: {e}")
    fails += 1
finally:
    subprocess.run(["rm", "-rf", tmp])
sys.exit(1 if fails else 0)
