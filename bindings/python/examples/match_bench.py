#!/usr/bin/python3
"""The cost of one kvt_tier_match_prefix of one block from Python (docs/BENCHMARKS.md): median
over 5 rounds of ns per call, for a list argument and for an array('Q') argument."""
import array
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import kvtier  # noqa: E402

m = kvtier.Manager(page_size=4, chunk_bytes=64, g1_blocks=64, g2_blocks=0)
m.release(m.register_hashes(m.alloc(1), [99]))
N = 200_000
for label, h in (("python", [99]), ("python-array", array.array("Q", [99]))):
    rounds = []
    for _ in range(5):
        t0 = time.perf_counter_ns()
        for _ in range(N):
            m.match_prefix(h)
        rounds.append((time.perf_counter_ns() - t0) / N)
    print("%s %.1f ns/call" % (label, sorted(rounds)[2]))
# Batch-shaped: one call for 5,000 blocks.
with kvtier.Manager(page_size=16, g1_blocks=8192, chunk_bytes=0) as big:
    hashes = kvtier.hash_sequence(array.array("I", range(16 * 5000)), 16)
    big.release(big.register_hashes(big.alloc(5000), hashes))
    rounds = []
    for _ in range(5):
        t0 = time.perf_counter_ns()
        got = big.match_prefix(hashes)
        big.release(got)
        rounds.append((time.perf_counter_ns() - t0) / 5000)
    print("python-batch5000 %.1f ns/block" % sorted(rounds)[2])
m.close()
