#!/usr/bin/env python3
"""Writes a tiny random IDX dataset for the CLI scripts: DIR/{train,t10k}-
{images-idx3,labels-idx1}-ubyte with SIDE x SIDE images, fresh noise on every
run unless --seed is given. Two classes (the left or the right half bright),
or with --quadrants four (one bright quadrant).
Usage: make_idx.py DIR SIDE NTRAIN NTEST [--quadrants] [--seed N]"""
import os
import random
import struct
import sys

args, quadrants, seed = [], False, None
it = iter(sys.argv[1:])
for a in it:
    if a == "--quadrants":
        quadrants = True
    elif a == "--seed":
        seed = int(next(it))
    else:
        args.append(a)
d, side, ntrain, ntest = args[0], int(args[1]), int(args[2]), int(args[3])
os.makedirs(d)
rng = random.Random(seed)
h = side // 2
for split, n in (("train", ntrain), ("t10k", ntest)):
    imgs, labs = bytearray(), bytearray()
    for i in range(n):
        if quadrants:
            k = rng.randrange(4)
            labs.append(k)
            for p in range(side * side):
                q = (p // side >= h) * 2 + (p % side >= h)
                imgs.append(min(255, rng.randrange(70) + (150 if q == k else 0)))
        else:
            k = rng.randrange(2)
            labs.append(k)
            imgs += bytes(min(255, rng.randrange(60) + (160 if (p % side >= h) == k else 0))
                          for p in range(side * side))
    open(f"{d}/{split}-images-idx3-ubyte", "wb").write(struct.pack(">IIII", 0x803, n, side, side) + imgs)
    open(f"{d}/{split}-labels-idx1-ubyte", "wb").write(struct.pack(">II", 0x801, n) + labs)
