#!/usr/bin/env python3
"""Independent model of DESIGN section 2's single-tier rule, for checking kvtier-replay.

It reads only the trace's hash_ids and never touches kvtier. One tier of CAPACITY blocks:
a request pins the longest prefix of its chain that is cached, allocates the rest (never
used slots first, then evicting the least recently released block), registers them, and
releases all its blocks in one call, where the block nearest the end of the chain is evicted
first. It prints the number of blocks served from the cache.

    oracle.py TRACE CAPACITY [CAPACITY ...]   ->   one JSON object {capacity: hit_blocks}
"""
import json
import sys
from collections import OrderedDict


def chains(path):
    """Each request as a list of keys, one per block, each naming the block's whole prefix."""
    keys = {}
    for line in open(path):
        if not line.strip():
            continue
        parent, chain = None, []
        for block_id in json.loads(line)["hash_ids"]:
            parent = keys.setdefault((parent, block_id), len(keys))
            chain.append(parent)
        yield chain


def g1_hits(requests, capacity):
    cached = set()            # registered: in use or evictable
    evictable = OrderedDict()  # first key = evicted first
    free = capacity            # slots holding nothing
    hits = 0
    for chain in requests:
        if len(chain) > capacity:
            raise SystemExit(f"a request of {len(chain)} blocks exceeds capacity {capacity}")
        n_hit = 0
        while n_hit < len(chain) and chain[n_hit] in cached:
            evictable.pop(chain[n_hit], None)  # pinned while the request runs
            n_hit += 1
        hits += n_hit
        for _ in range(len(chain) - n_hit):
            if free:
                free -= 1
            else:
                victim, _ = evictable.popitem(last=False)
                cached.discard(victim)
        for key in chain[n_hit:]:
            if key in cached:   # already registered: the new slot goes back, the old is pinned
                free += 1
                evictable.pop(key, None)
            else:
                cached.add(key)
        for key in reversed(chain):  # one release call: the tail is evicted first
            evictable[key] = None
    return hits


def main():
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    requests = list(chains(sys.argv[1]))
    print(json.dumps({c: g1_hits(requests, int(c)) for c in sys.argv[2:]}))


if __name__ == "__main__":
    main()
