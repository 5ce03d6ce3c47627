"""The initializers of an ONNX file read straight from the protobuf wire
format (no onnx package needed); shared by onnx_test.py and seq_check.py."""
import struct

import numpy as np


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


def initializers(path, floats_only=False):
    """name -> float32 array of every initializer (raw data or float_data); floats_only: initializers of
    another data type are left out (else one is an error)."""
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
        if floats_only and dtype != 1:
            continue
        assert dtype == 1, f"initializer {name}: data type {dtype}"
        arr = np.frombuffer(raw, dtype="<f4") if raw is not None else np.array(floats, dtype=np.float32)
        out[name] = arr.astype(np.float32).reshape(dims)
    return out
