#!/usr/bin/env python3
"""Writes the small seed corpora under tests/fuzz/corpus/<target>/ (run
once; the files are committed). Usage: make_seeds.py [REPO_ROOT]."""
import gzip, json, os, random, shutil, struct, sys, zlib

root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..")
out = os.path.join(root, "tests", "fuzz", "corpus")
rng = random.Random(11)


def put(target, name, data):
    d = os.path.join(out, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


# model files: the shipped ones and a branching one
for m in ("lenet5.cfg", "resnet-mini.cfg"):
    put("model", m, open(os.path.join(root, "models", m), "rb").read())
put("model", "branch.cfg", "[net]\nchannels = 1\nheight = 8\nwidth = 8\nclasses = 4\nbatch = 2\n"
    "[conv]\nname = c1\nfilters = 4\nsize = 3\npad = 1\nactivation = relu\n"
    "[conv]\nname = c2\nfilters = 4\nsize = 3\npad = 1\n[add]\ninput = c1, c2\n"
    "[maxpool]\nsize = 2\n[dense]\nunits = 4\n[softmax]\n")


def ckpt(tensors, meta):
    """clgrad-ckpt-2: header.crc32 first, CRC-32 of the header with zeros there."""
    meta = dict(meta)
    meta["format"] = "clgrad-ckpt-2"
    hdr, data, off = {}, b"", 0
    for name, dt, shape, raw in tensors:
        meta["crc32." + name] = "%08x" % zlib.crc32(raw)
        hdr[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(raw)]}
        off += len(raw)
        data += raw
    full = {"__metadata__": dict([("header.crc32", "00000000")] + list(meta.items()))}
    full.update(hdr)
    text = json.dumps(full, separators=(",", ":"))
    text += " " * (-len(text) % 8)
    crc = "%08x" % zlib.crc32(text.encode())
    text = text.replace('"header.crc32":"00000000"', '"header.crc32":"%s"' % crc, 1)
    return struct.pack("<Q", len(text)) + text.encode() + data


w = struct.pack("<6f", *[rng.uniform(-1, 1) for _ in range(6)])
put("checkpoint", "small.safetensors", ckpt([("fc.weight", "F32", [2, 3], w), ("fc.bias", "F32", [2], w[:8])],
    {"step": "12", "epoch": "1", "norm.std.0": "0.3", "rng": "0123456789abcdef:fedcba9876543210"}))
put("checkpoint", "types.safetensors", ckpt([("a", "U8", [3], b"\x01\x02\x03"), ("b", "I64", [], b"\x00" * 8),
    ("c", "F16", [1, 1], b"\x00\x3c")], {"optimizer": "adam"}))

imgs = bytes(rng.randrange(256) for _ in range(2 * 4 * 4))
idx_i = struct.pack(">IIII", 0x803, 2, 4, 4) + imgs
idx_l = struct.pack(">II", 0x801, 2) + b"\x01\x07"
put("idx", "images.idx", idx_i)
put("idx", "labels.idx", idx_l)
put("idx", "images.idx.gz", gzip.compress(idx_i, mtime=0))
put("idx", "two-members.gz", gzip.compress(idx_l[:5], mtime=0) + gzip.compress(idx_l[5:], mtime=0))

rec = bytes([3]) + bytes(rng.randrange(256) for _ in range(3072))
put("cifar", "one.bin", rec)

p5 = b"P5\n4 4\n255\n" + bytes(rng.randrange(256) for _ in range(16))
put("pgm", "p5.pgm", p5)
put("pgm", "p2.pgm", "P2\n# comment\n3 2\n15\n0 3 7\n15 1 2\n")
put("pgm", "p5.pgm.gz", gzip.compress(p5, mtime=0))

put("tune", "db.json", '{"format": "clgrad-tune", "version": 1, "device": "fuzz device", "driver": "fuzz driver",\n'
    ' "entries": {"gemm/M64N64K64": {"backend": "own", "MR": 4, "NR": 4, "KU": 2, "ms": 0.5},\n'
    '  "conv/x": {"backend": "clblast", "ms": 1.25}}}\n')

put("convalgos", "algos.json", '{"format": "clgrad-conv-algos", "version": 2, "device": "d", "entries": [\n'
    ' {"key": "v3:fwd:n1,c3,h8,w8,k4,r3,s3,p1x1,u1x1,d1x1,g1", "algo": "im2col", "ms": 0.1200, "dev": "0123456789abcdef"}\n'
    ', {"key": "v3:bwd-data:n1,c3,h8,w8,k4,r3,s3,p1x1,u1x1,d1x1,g1", "algo": "direct", "ms": 0.3000, "dev": "0123456789abcdef"}\n'
    ']}\n')

binary = bytes(rng.randrange(256) for _ in range(24))
key = 0x1122334455667788
put("progcache", "entry.clbin", b"CLGBIN\0\0" + struct.pack("<II", 1, 0) + struct.pack("<QQ", key, len(binary))
    + struct.pack("<II", zlib.crc32(binary), 0) + binary)

# issue 26: numeric layer names (refused), selectors / split weights / option values (fuzz_select: the
# first byte picks the surface: 4*k + 0 selector over k % 5 devices, 4*k + 1 split over 1 + k % 4 devices,
# 4*k + 2 option k), ONNX attributes of the wrong type or out of range
put("model", "numeric-name.cfg", "[net]\nchannels = 1\nheight = 4\nwidth = 4\nclasses = 3\n"
    "[dense]\nname = -1\nunits = 4\n[dense]\nname = 3\nunits = 3\ninput = -1\n[softmax]\n")
# a sequence block (issue 23): embedding, posembed, layernorm, dense per position, tied head, token loss
put("model", "seq-block.cfg", open(os.path.join(root, "tests", "fuzz", "corpus", "model", "seq-block.cfg"), "rb").read())
for i, (b, text) in enumerate([(4 * 2, "0,1"), (4 * 3, "name:basic"), (4 * 2, "0,"), (4 * 2, ""), (4 * 4, "gpu"),
                               (4 * 1 + 1, "3,1"), (4 * 1 + 1, "1e308,1e308"), (4 * 2 + 1, "0.5,2.5e-1,1"),
                               (4 * 0 + 1, "even"), (4 * 0 + 2, "all"), (4 * 1 + 2, "ro")]):
    put("select", f"seed{i}", bytes([b]) + text.encode())


def _vi(v):
    o = bytearray()
    while True:
        b, v = v & 0x7F, v >> 7
        o.append(b | (0x80 if v else 0))
        if not v:
            return bytes(o)


def pb_int(num, v):
    return _vi(num << 3) + _vi(v & (2**64 - 1))


def pb_len(num, b):
    b = b.encode() if isinstance(b, str) else b
    return _vi(num << 3 | 2) + _vi(len(b)) + b


def onnx_model(nodes, init, x_dims, y_dims):
    def vi(name, dims):
        shape = b"".join(pb_len(1, pb_int(1, d)) for d in dims)
        return pb_len(1, name) + pb_len(2, pb_len(1, pb_int(1, 1) + pb_len(2, shape)))
    graph = b"".join(pb_len(1, n) for n in nodes) + init + pb_len(11, vi("x", x_dims)) + pb_len(12, vi("y", y_dims))
    return pb_int(1, 7) + pb_len(8, pb_int(2, 13)) + pb_len(7, graph)


def onnx_node(op, ins, outs, name, attrs=b""):
    return b"".join(pb_len(1, i) for i in ins) + b"".join(pb_len(2, o) for o in outs) + pb_len(3, name) + \
        pb_len(4, op) + attrs


w64 = struct.pack("<64f", *([0.1] * 64))
flat = onnx_node("Flatten", ["x"], ["f"], "flat")
init_w = pb_len(5, pb_int(1, 4) + pb_int(1, 16) + pb_int(2, 1) + pb_len(8, "w") + pb_len(9, w64))
trans_b2 = pb_len(5, pb_len(1, "transB") + pb_int(20, 2) + pb_int(3, 2))
put("onnx", "gemm-transb2.onnx", onnx_model([flat, onnx_node("Gemm", ["f", "w"], ["y"], "fc", trans_b2)], init_w,
                                            [1, 1, 4, 4], [1, 4]))
init_c = pb_len(5, pb_int(1, 4) + pb_int(1, 1) + pb_int(1, 4) + pb_int(1, 4) + pb_int(2, 1) + pb_len(8, "wc") +
                pb_len(9, w64))
group_f = pb_len(5, pb_len(1, "group") + pb_int(20, 1) + _vi(2 << 3 | 5) + struct.pack("<f", 1.5))
put("onnx", "conv-group-float.onnx", onnx_model([onnx_node("Conv", ["x", "wc"], ["c"], "conv", group_f),
                                                 onnx_node("Flatten", ["c"], ["y"], "flat")], init_c,
                                                [1, 1, 4, 4], [1, 4]))
