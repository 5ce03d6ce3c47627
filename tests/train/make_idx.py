#!/usr/bin/env python3
"""Writes a tiny random IDX dataset for the CLI scripts: DIR/{train,t10k}-
{images-idx3,labels-idx1}-ubyte with SIDE x SIDE images of 2 classes (the
left or the right half bright), fresh noise on every run.
Usage: make_idx.py DIR SIDE NTRAIN NTEST"""
import os
import random
import struct
import sys

d, side, ntrain, ntest = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
os.makedirs(d)
rng = random.Random()
for split, n in (("train", ntrain), ("t10k", ntest)):
    imgs, labs = bytearray(), bytearray()
    for i in range(n):
        k = rng.randrange(2)
        labs.append(k)
        imgs += bytes(min(255, rng.randrange(60) + (160 if (p % side >= side // 2) == k else 0))
                      for p in range(side * side))
    open(f"{d}/{split}-images-idx3-ubyte", "wb").write(struct.pack(">IIII", 0x803, n, side, side) + imgs)
    open(f"{d}/{split}-labels-idx1-ubyte", "wb").write(struct.pack(">II", 0x801, n) + labs)
