#!/usr/bin/env python3
"""Writes the starting seeds of fuzz/corpus/<name>/: random programs of several lengths
from a fixed generator, so that the seeds are reproducible. The fuzzers' own finds are
merged in on top (see docs/FUZZING.md)."""
import os
import random

HERE = os.path.dirname(os.path.abspath(__file__))
rng = random.Random(20261121)
for name, lengths in (("api", [16, 64, 256, 1024, 4096]),
                      ("config", [8, 32, 256, 512]),
                      ("hash", [4, 64, 1024, 8192, 20000])):
    d = os.path.join(HERE, "corpus", name)
    os.makedirs(d, exist_ok=True)
    for i, n in enumerate(lengths * 3):
        with open(os.path.join(d, "seed-%02d" % i), "wb") as f:
            f.write(bytes(rng.randrange(256) for _ in range(n)))
