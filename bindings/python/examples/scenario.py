#!/usr/bin/python3
"""Seed 003's two requests through the tiers: the scenario of examples/scenario/scenario.c,
line for line the same output. Run: KVTIER_LIB_DIR=build/src python3 scenario.py"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import kvtier  # noqa: E402

PAGE = 4


def kv_bytes(h, n):
    return bytes(((h >> (8 * (i % 8))) ^ i) & 0xFF for i in range(n))


def main():
    with kvtier.Manager(page_size=PAGE, num_layers=1, num_outer=2, chunk_bytes=64,
                        g1_blocks=8, g2_blocks=16, g3_blocks=0) as m:
        salt = kvtier.hash_salt(b"kvtier-scenario")
        a_tokens = [ord(c) for c in "Hello, world!"]
        a_hash = kvtier.hash_sequence(a_tokens, PAGE, salt)
        a = m.alloc(len(a_hash))
        for b, h in zip(a, a_hash):
            data = m.block_data(b)
            data[:] = kv_bytes(h, len(data))
        a = m.register_hashes(a, a_hash)
        with m.offload(a, kvtier.G2, user_data=1) as x:
            moved = x.wait()
        m.release(a)
        print("request A: %d tokens, %d full blocks, computed %d, offloaded %d to G2"
              % (len(a_tokens), len(a_hash), len(a_hash), moved))
        print("request A: first block hash 0x%016x" % a_hash[0])

        list(m.events())
        m.release(m.alloc(8))  # evicts A's blocks from G1
        removed = sum(1 for e in m.events()
                      if e.type == kvtier.BLOCK_REMOVED and e.tier == kvtier.G1)
        print("G1 evicted: %d blocks removed" % removed)

        b_tokens = [ord(c) for c in "Hello, world! How are you?"]
        b_hash = kvtier.hash_sequence(b_tokens, PAGE, salt)
        g1 = m.match_prefix(b_hash, kvtier.G1)
        g2 = m.match_prefix(b_hash[len(g1):], kvtier.G2)
        dst = m.alloc(len(g2))
        with m.onboard(g2, dst, user_data=2) as x:
            moved = x.wait()
            g1 += x.blocks()
        same = all(bytes(m.block_data(b)) == kv_bytes(h, len(m.block_data(b)))
                   for b, h in zip(g1, a_hash))
        m.release(g2)
        m.release(g1)
        print("request B: %d tokens, %d full blocks, G1 hit %d, G2 hit %d, onboarded %d"
              % (len(b_tokens), len(b_hash), len(g1) - len(g2), len(g2), moved))
        print("request B: onboarded bytes equal request A's: %s" % ("yes" if same else "no"))
        m.check()
        return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
