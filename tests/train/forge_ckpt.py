#!/usr/bin/env python3
"""Rewrites a clgrad checkpoint's metadata and re-signs its header checksum
(header.crc32: CRC-32 of the padded header with that value read as
"00000000"), as a hostile or careless editor would: the file still passes
the loader's integrity checks, so what resume does with the values is tested.
Usage: forge_ckpt.py IN OUT KEY=VALUE... (KEY= alone deletes KEY)."""
import json
import struct
import sys
import zlib

src, dst, edits = sys.argv[1], sys.argv[2], sys.argv[3:]
blob = open(src, "rb").read()
(n,) = struct.unpack("<Q", blob[:8])
header = json.loads(blob[8:8 + n].decode("utf-8"))
meta = header["__metadata__"]
for e in edits:
    k, v = e.split("=", 1)
    if v == "":
        meta.pop(k, None)
    else:
        meta[k] = v
meta = {"header.crc32": "00000000", **{k: v for k, v in meta.items() if k != "header.crc32"}}
header = {"__metadata__": meta, **{k: v for k, v in header.items() if k != "__metadata__"}}
text = json.dumps(header, separators=(",", ":")).encode("utf-8")
text += b" " * (-len(text) % 8)
crc = "%08x" % (zlib.crc32(text) & 0xFFFFFFFF)
text = text.replace(b'"header.crc32":"00000000"', b'"header.crc32":"' + crc.encode() + b'"', 1)
open(dst, "wb").write(struct.pack("<Q", len(text)) + text + blob[8 + n:])
