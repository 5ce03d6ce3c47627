#!/usr/bin/python3
"""Writes the seed corpus of fuzz_onnx (tests/fuzz/corpus/onnx/): tiny
PyTorch exports covering every mapped operator (run once with Debian's
python3 + python3-torch; the files are committed), plus clgrad's own export
of two of them when a clgrad program is given.
usage: make_onnx_seeds.py [REPO_ROOT [CLGRAD]]"""
import os
import subprocess
import sys

import torch
import torch.nn as nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "onnx"))
import torch_models as tm  # noqa: E402

root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..")
out = os.path.join(root, "tests", "fuzz", "corpus", "onnx")
os.makedirs(out, exist_ok=True)
torch.manual_seed(5)


class Small(nn.Module):
    def __init__(self, act):
        super().__init__()
        self.c = nn.Conv2d(1, 2, 3, padding=1)
        self.p = nn.MaxPool2d(2)
        self.f = nn.Linear(18, 3)
        self.act = act

    def forward(self, x):
        return torch.softmax(self.f(torch.flatten(self.p(self.act(self.c((x - 0.5) / 0.25))), 1)), 1)


seeds = {"relu": Small(nn.ReLU()), "gelu": Small(nn.GELU()), "leaky": Small(nn.LeakyReLU(0.2)),
         "sigmoid": Small(nn.Sigmoid()), "branch": tm.Branch()}
x = torch.rand(1, 1, 6, 6)

for name, m in seeds.items():
    m.eval()
    path = os.path.join(out, name + ".onnx")
    torch.onnx.export(m, x, path, opset_version=13, input_names=["input"], output_names=["output"],
                      dynamic_axes={"input": {0: "N"}})
    if name == "branch":
        torch.onnx.export(m, x, os.path.join(out, "branch-bn.onnx"), opset_version=13,
                          training=torch.onnx.TrainingMode.PRESERVE, do_constant_folding=False)
    print(path, os.path.getsize(path))
if len(sys.argv) > 2:
    for name in ("gelu", "branch"):
        dst = os.path.join(out, "clgrad-" + name + ".onnx")
        subprocess.run([sys.argv[2], "export", os.path.join(out, name + ".onnx"), "-o", dst], check=True)
        print(dst, os.path.getsize(dst))
