#!/usr/bin/python3
"""Seed 003 through the connector, in one process: requests A and B of the canonical
scenario (docs/CONNECTOR.md), line for line the transcript every language prints.
Run: KVTIER_LIB_DIR=build/src python3 connector_seed003.py

The pieces (the engine's G1 buffer, the KV a forward writes, one engine step) are also used
by tests/test_connector.py."""
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import kvtier  # noqa: E402

PAGE, LAYERS, OUTER, CHUNK = 16, 2, 2, 256
BLOCK = LAYERS * OUTER * CHUNK  # 1024 bytes
NUM_GPU_BLOCKS = 100
TOKENS_A = list(range(1000, 1040))
TOKENS_B = TOKENS_A[:32] + list(range(2000, 2020))


def kv(h):
    """The KV a forward writes into a full block whose sequence hash is h."""
    return bytes(((h >> (8 * (k % 8))) & 0xFF) ^ (k // 8 & 0xFF) for k in range(BLOCK))


def hashes(tokens):
    """Sequence hashes of the full blocks, with the connector's default (empty) salt."""
    return kvtier.hash_sequence(tokens, PAGE, kvtier.hash_salt(b""))


def manager():
    return kvtier.Manager(page_size=PAGE, num_layers=LAYERS, num_outer=OUTER, chunk_bytes=CHUNK,
                          g1_blocks=1, g2_blocks=50, g3_blocks=0)


def connector(m, role=kvtier.ROLE_BOTH):
    return kvtier.Connector(m, role=role, offload=kvtier.OFFLOAD_EAGER, store_tier=kvtier.G2,
                            num_gpu_blocks=NUM_GPU_BLOCKS, load_async=0)


class Engine:
    """The engine's G1: one zero-filled host buffer; block b is bytes [b*1024, b*1024+1024),
    chunk (layer, outer) at offset (layer*2+outer)*256 within it."""

    def __init__(self):
        self.buf = bytearray(NUM_GPU_BLOCKS * BLOCK)

    def layout(self):
        view = memoryview(self.buf)
        return kvtier.G1Layout([view[i * CHUNK:] for i in range(LAYERS * OUTER)],
                               [BLOCK] * (LAYERS * OUTER))

    def block(self, b):
        return bytes(self.buf[b * BLOCK:(b + 1) * BLOCK])

    def forward(self, writes):
        for b, h in writes:
            self.buf[b * BLOCK:(b + 1) * BLOCK] = kv(h)


def completed(block_ids, tokens, num_computed, num_scheduled):
    """(G1 block, hash) of the full blocks a step computes: those from num_computed on (loaded
    blocks lie below it) that the step's tokens complete."""
    hs = hashes(tokens)
    return [(block_ids[i], hs[i]) for i in range(num_computed // PAGE,
                                                 (num_computed + num_scheduled) // PAGE)]


def worker_step(c, engine, meta, writes, after_load=None):
    """The worker's part of a step, up to wait_for_save; returns after_load()'s result, taken
    once the loads are in."""
    c.bind_connector_metadata(meta)
    c.start_load_kv()
    for layer in range(LAYERS):
        c.wait_for_layer_load(layer)
    seen = after_load() if after_load else None
    engine.forward(writes)
    for layer in range(LAYERS):
        c.save_kv_layer(layer)
    c.wait_for_save()
    return seen


def drain(get_finished, update_connector_output, stats, stored, loaded, timeout=5.0):
    """get_finished and update_connector_output until the scheduler's stats show `stored`
    stores and `loaded` loads (at least one round). Returns the accumulated Finished."""
    sending, recving, errors = [], [], []
    deadline = time.monotonic() + timeout
    while True:
        f = get_finished()
        sending += f.finished_sending
        recving += f.finished_recving
        errors += f.load_error_block_ids
        update_connector_output(f.report)
        s = stats()
        if s["stored_blocks"] == stored and s["loaded_blocks"] == loaded:
            return kvtier.Finished(sending, recving, errors, b"")
        if time.monotonic() > deadline:
            raise RuntimeError("after %g s: stored %d loaded %d, expected %d and %d"
                               % (timeout, s["stored_blocks"], s["loaded_blocks"], stored, loaded))
        time.sleep(0.001)


def step(c, engine, reqs, stored, loaded, after_load=None):
    """One engine step in one process: reqs are (ScheduledRequest, all block ids, tokens)."""
    meta = c.build_connector_meta([r for r, _, _ in reqs])
    writes = [w for r, blocks, tokens in reqs
              for w in completed(blocks, tokens, r.num_computed_tokens, r.num_scheduled_tokens)]
    seen = worker_step(c, engine, meta, writes, after_load)
    done = drain(c.get_finished, c.update_connector_output, c.stats, stored, loaded)
    c.clear_connector_metadata()
    return seen, done


def states(c, req_id):
    return " ".join(kvtier.slot_state_str(s) for s in c.slot_state(req_id)[1])


def main():
    engine = Engine()
    with manager() as m, connector(m) as c:
        c.register_kv_caches(engine.layout(), NUM_GPU_BLOCKS)
        S = kvtier.ScheduledRequest

        # 1. A computes its two full blocks; eager offload stores them to G2.
        blocks_a = [1, 2, 3]
        n, is_async = c.get_num_new_matched_tokens("A", TOKENS_A, 0)
        print("A: matched %d async %d" % (n, is_async))
        c.update_state_after_alloc("A", blocks_a, 0)
        step(c, engine, [(S("A", 0, 40), blocks_a, TOKENS_A)], stored=2, loaded=0)
        s = c.stats()
        print("A: stored %d loaded %d" % (s["stored_blocks"], s["loaded_blocks"]))
        print("A: delay_free %d" % c.request_finished("A"))
        print("A: states %s" % states(c, "A"))

        # 2. B shares A's first 32 tokens: loaded from G2 into its own blocks 4 and 5.
        blocks_b = [4, 5, 6, 7]
        n, is_async = c.get_num_new_matched_tokens("B", TOKENS_B, 0)
        print("B: matched %d async %d" % (n, is_async))
        c.update_state_after_alloc("B", blocks_b, n)
        def matching_a():
            return sum(engine.block(a) == engine.block(b)
                       for a, b in zip(blocks_a[:2], blocks_b[:2]))
        same, done = step(c, engine, [(S("B", 32, 20), blocks_b, TOKENS_B)], stored=3, loaded=2,
                          after_load=matching_a)
        print("B: loaded blocks matching A's %d" % same)
        # none: a synchronous load, which the engine waited for in its step
        print("B: finished_recving %s" % (" ".join(done.finished_recving) or "none"))
        s = c.stats()
        print("B: stored %d loaded %d" % (s["stored_blocks"], s["loaded_blocks"]))

        # 3. B decodes one token: nothing to load or store.
        step(c, engine, [(S("B", 52, 1, (), [3000]), blocks_b, TOKENS_B + [3000])],
             stored=3, loaded=2)
        print("B: delay_free %d" % c.request_finished("B"))
        print("B: states %s" % states(c, "B"))

        # 4. G2 holds B's three full blocks, with the bytes the forwards wrote.
        hs = hashes(TOKENS_B)
        g2 = m.match_prefix(hs, kvtier.G2)
        matching = sum(bytes(m.block_data(b)) == kv(h) for b, h in zip(g2, hs))
        m.release(g2)
        print("G2: registered %d matching %d" % (len(g2), matching))
        return 0 if len(g2) == matching == 3 else 1


if __name__ == "__main__":
    sys.exit(main())
