#!/usr/bin/env python3
"""Reads a clgrad checkpoint with numpy only, following the safetensors
layout (u64 LE header length, JSON header, raw little-endian tensors), and
checks it against the writer's manifest: dtypes, shapes, values, metadata
and each tensor's CRC-32. Usage: read_checkpoint.py CKPT_WRITER."""
import json
import os
import struct
import subprocess
import sys
import tempfile
import zlib

try:
    import numpy as np
except ImportError:
    print("skip: numpy is not installed")
    sys.exit(77)

DTYPES = {"F32": "<f4", "F16": "<f2", "I32": "<i4", "I64": "<i8", "U8": "u1"}


def read_safetensors(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    assert 8 + n <= len(blob), "header length beyond the file"
    assert n % 8 == 0, "header not padded to 8 bytes"
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    data = blob[8 + n:]
    meta = header.pop("__metadata__", {})
    tensors = {}
    spans = []
    for name, info in header.items():
        b, e = info["data_offsets"]
        dt = np.dtype(DTYPES[info["dtype"]])
        shape = tuple(info["shape"])
        count = int(np.prod(shape)) if shape else 1
        assert e - b == count * dt.itemsize, name
        tensors[name] = (info["dtype"], np.frombuffer(data[b:e], dtype=dt).reshape(shape), data[b:e])
        spans.append((b, e))
    spans.sort()
    pos = 0
    for b, e in spans:
        assert b == pos, "tensors not contiguous"
        pos = e
    assert pos == len(data), "data section not covered exactly"
    return tensors, meta


def main():
    writer = sys.argv[1]
    with tempfile.TemporaryDirectory() as d:
        ck = os.path.join(d, "w.safetensors")
        man = os.path.join(d, "w.json")
        subprocess.run([writer, ck, man], check=True)
        tensors, meta = read_safetensors(ck)
        with open(man, encoding="utf-8") as f:
            want = json.load(f)
    assert set(tensors) == set(want["tensors"]), (sorted(tensors), sorted(want["tensors"]))
    for name, w in want["tensors"].items():
        dtype, arr, raw = tensors[name]
        assert dtype == w["dtype"], (name, dtype, w["dtype"])
        assert list(arr.shape) == w["shape"], (name, arr.shape, w["shape"])
        flat = arr.reshape(-1)
        if dtype == "F16":
            got = flat.view("<u2").astype(np.int64)
            exp = np.array(w["values"], dtype=np.int64)
        elif dtype == "F32":
            got = flat
            exp = np.array(w["values"], dtype=np.float32)  # %.9g round-trips f32 exactly
        else:
            got = flat.astype(np.int64)
            exp = np.array(w["values"], dtype=np.int64)
        assert got.shape == exp.shape and np.array_equal(got, exp), name
        crc = "%08x" % (zlib.crc32(raw) & 0xFFFFFFFF)
        assert meta.get("crc32." + name) == crc, (name, meta.get("crc32." + name), crc)
    assert meta == want["metadata"], "metadata differs"
    for key in ("format", "model", "step", "epoch", "rng", "optimizer"):
        assert key in meta, key
    assert meta["model"].startswith("[net]\n"), meta["model"]
    print("ok: %d tensors, %d metadata entries" % (len(tensors), len(meta)))


if __name__ == "__main__":
    main()
