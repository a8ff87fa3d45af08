"""The connector from Python: seed 003 in one process and across two (the scheduler here, the
worker in a child process, metadata and reports crossing a pipe as bytes), and bad input.
The scenario's pieces come from examples/connector_seed003.py."""
import os
import pickle
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))
import kvtier  # noqa: E402
import connector_seed003 as seed  # noqa: E402

S = kvtier.ScheduledRequest
HASH_A, HASH_B = seed.hashes(seed.TOKENS_A), seed.hashes(seed.TOKENS_B)
STATES_A = [kvtier.SLOT_INITIALIZED, kvtier.SLOT_PREFILLING, kvtier.SLOT_FINISHING,
            kvtier.SLOT_FINISHED]
STATES_B = [kvtier.SLOT_INITIALIZED, kvtier.SLOT_ONBOARD_STAGED, kvtier.SLOT_ONBOARDING,
            kvtier.SLOT_PREFILLING, kvtier.SLOT_DECODING, kvtier.SLOT_FINISHING,
            kvtier.SLOT_FINISHED]
TRANSCRIPT = os.path.join(HERE, "..", "..", "..", "examples", "connector", "seed003.txt")


def test_example_prints_the_canonical_transcript():
    out = subprocess.run([sys.executable, os.path.join(HERE, "..", "examples",
                                                       "connector_seed003.py")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    with open(TRANSCRIPT) as f:  # what C's examples/connector/seed003.c prints
        assert out.stdout == f.read()


def test_seed003_in_one_process():
    engine = seed.Engine()
    with seed.manager() as m, seed.connector(m) as c:
        c.register_kv_caches(engine.layout(), seed.NUM_GPU_BLOCKS)

        assert c.get_num_new_matched_tokens("A", seed.TOKENS_A, 0) == (0, False)
        c.update_state_after_alloc("A", [1, 2, 3], 0)
        seed.step(c, engine, [(S("A", 0, 40), [1, 2, 3], seed.TOKENS_A)], stored=2, loaded=0)
        g2 = m.match_prefix(HASH_A, kvtier.G2)
        assert [bytes(m.block_data(b)) for b in g2] == [seed.kv(h) for h in HASH_A]
        m.release(g2)
        assert c.request_finished("A") is False
        assert c.slot_state("A") == (kvtier.SLOT_FINISHED, STATES_A)

        assert c.get_num_new_matched_tokens("B", seed.TOKENS_B, 0) == (32, False)
        assert c.slot_state("B")[0] == kvtier.SLOT_ONBOARD_STAGED
        c.update_state_after_alloc("B", [4, 5, 6, 7], 32)
        loaded, done = seed.step(c, engine, [(S("B", 32, 20), [4, 5, 6, 7], seed.TOKENS_B)],
                                 stored=3, loaded=2,
                                 after_load=lambda: [engine.block(4), engine.block(5)])
        assert loaded == [seed.kv(HASH_A[0]), seed.kv(HASH_A[1])]  # in before the forward
        # a load the engine waited for in its step is not listed
        assert done.finished_recving == [] and done.load_error_block_ids == []
        assert engine.block(6) == seed.kv(HASH_B[2])

        seed.step(c, engine, [(S("B", 52, 1, (), [3000]), [4, 5, 6, 7], seed.TOKENS_B + [3000])],
                  stored=3, loaded=2)
        assert c.request_finished("B") is False
        assert c.slot_state("B") == (kvtier.SLOT_FINISHED, STATES_B)

        g2 = m.match_prefix(HASH_B, kvtier.G2)
        assert [bytes(m.block_data(b)) for b in g2] == [seed.kv(h) for h in HASH_B]
        m.release(g2)
        stored = [e for e in c.take_events() if e.type == kvtier.BLOCK_STORED]
        assert sorted(e.hash for e in stored if e.tier == kvtier.G2) == sorted(HASH_B)
        s = c.stats()
        assert (s["stored_blocks"], s["loaded_blocks"], s["load_errors"]) == (3, 2, 0)
        assert s["matched_tokens"] == 32
        t = s["transitions"]
        assert t[0][kvtier.SLOT_INITIALIZED] == 2
        assert t[kvtier.SLOT_ONBOARDING][kvtier.SLOT_PREFILLING] == 1
        assert t[kvtier.SLOT_PREFILLING][kvtier.SLOT_DECODING] == 1
        assert sum(map(sum, t)) == len(STATES_A) + len(STATES_B)
        m.check()


def test_lazy_offload_stores_a_block_when_its_id_is_given_to_another_request():
    engine = seed.Engine()
    with seed.manager() as m, kvtier.Connector(m, offload=kvtier.OFFLOAD_LAZY,
                                               num_gpu_blocks=seed.NUM_GPU_BLOCKS) as c:
        c.register_kv_caches(engine.layout(), seed.NUM_GPU_BLOCKS)
        c.get_num_new_matched_tokens("A", seed.TOKENS_A)
        c.update_state_after_alloc("A", [1, 2, 3], 0)
        seed.step(c, engine, [(S("A", 0, 40), [1, 2, 3], seed.TOKENS_A)], stored=0, loaded=0)
        assert c.request_finished("A") is False  # nothing stored: its blocks stay in G1

        # D gets A's block ids to write: A's blocks go to G2 before D's forward overwrites them.
        tokens_d = list(range(5000, 5040))
        c.get_num_new_matched_tokens("D", tokens_d)
        c.update_state_after_alloc("D", [1, 2, 3], 0)
        seed.step(c, engine, [(S("D", 0, 40), [1, 2, 3], tokens_d)], stored=2, loaded=0)
        assert engine.block(1) == seed.kv(seed.hashes(tokens_d)[0])

        assert c.get_num_new_matched_tokens("C", seed.TOKENS_A) == (32, False)
        c.update_state_after_alloc("C", [4, 5, 6], 32)
        read, _ = seed.step(c, engine, [(S("C", 32, 8), [4, 5, 6], seed.TOKENS_A)], stored=2,
                            loaded=2, after_load=lambda: [engine.block(4), engine.block(5)])
        assert read == [seed.kv(h) for h in HASH_A]


def test_b_finished_while_its_load_is_in_flight():
    """An asynchronous load of B is running when the engine finishes B. vLLM keeps the blocks
    of a request waiting for remote KV until its finished_recving and frees it there, so B
    gets delay_free False, reaches finished_recving once and never finished_sending."""
    engine = seed.Engine()
    with seed.manager() as m, kvtier.Connector(m, num_gpu_blocks=seed.NUM_GPU_BLOCKS,
                                               load_async=1) as c:
        c.register_kv_caches(engine.layout(), seed.NUM_GPU_BLOCKS)
        c.get_num_new_matched_tokens("A", seed.TOKENS_A)
        c.update_state_after_alloc("A", [1, 2, 3], 0)
        seed.step(c, engine, [(S("A", 0, 40), [1, 2, 3], seed.TOKENS_A)], stored=2, loaded=0)
        c.request_finished("A")

        assert c.get_num_new_matched_tokens("B", seed.TOKENS_B) == (32, True)
        c.update_state_after_alloc("B", [4, 5], 32)
        c.bind_connector_metadata(c.build_connector_meta([]))  # B waits for its load
        c.start_load_kv()
        assert c.request_finished("B") is False
        assert c.slot_state("B")[0] == kvtier.SLOT_FINISHING
        c.wait_for_save()
        done = seed.drain(c.get_finished, c.update_connector_output, c.stats, 2, 2)
        c.clear_connector_metadata()
        assert done.finished_recving == ["B"] and done.finished_sending == []
        assert c.slot_state("B") == (kvtier.SLOT_FINISHED,
                                     STATES_B[:3] + [kvtier.SLOT_FINISHING, kvtier.SLOT_FINISHED])
        assert [engine.block(4), engine.block(5)] == [seed.kv(h) for h in HASH_A]

        for _ in range(3):  # later steps say nothing more of B
            c.bind_connector_metadata(c.build_connector_meta([]))
            c.start_load_kv()
            c.wait_for_save()
            f = c.get_finished()
            c.update_connector_output(f.report)
            c.clear_connector_metadata()
            assert "B" not in f.finished_sending + f.finished_recving


# ---- two processes: the worker runs in a child, behind a pipe of pickled calls ----

def worker_main():
    """The child: a WORKER connector over its own manager and G1, serving calls read from
    stdin as pickled (name, args); each answer is ("ok", result) or ("error", status,
    message). Metadata comes in, and reports go out, as bytes."""
    calls, answers = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # the pipe carries answers only
    engine = seed.Engine()
    with seed.manager() as m, seed.connector(m, kvtier.ROLE_WORKER) as c:
        c.register_kv_caches(engine.layout(), seed.NUM_GPU_BLOCKS)

        def step(meta, writes, read_after_load):
            return seed.worker_step(c, engine, meta, writes,
                                    lambda: [engine.block(b) for b in read_after_load])

        serve = {"step": step, "get_finished": lambda: tuple(c.get_finished()),
                 "clear": c.clear_connector_metadata, "bind": c.bind_connector_metadata}
        while True:
            try:
                name, args = pickle.load(calls)
            except EOFError:
                return
            try:
                answer = ("ok", serve[name](*args))
            except kvtier.Error as e:
                answer = ("error", e.status, e.message)
            pickle.dump(answer, answers)
            answers.flush()


class Worker:
    """The parent's end of the pipe."""

    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def call(self, name, *args):
        pickle.dump((name, args), self.proc.stdin)
        self.proc.stdin.flush()
        answer = pickle.load(self.proc.stdout)
        if answer[0] == "error":
            raise kvtier.Error(answer[2], answer[1])
        return answer[1]

    def get_finished(self):
        return kvtier.Finished(*self.call("get_finished"))

    def close(self):
        self.proc.stdin.close()
        assert self.proc.wait(timeout=30) == 0


def remote_step(c, worker, reqs, stored, loaded, read_after_load=()):
    meta = c.build_connector_meta([r for r, _, _ in reqs])
    assert isinstance(meta, bytes) and meta
    writes = [w for r, blocks, tokens in reqs
              for w in seed.completed(blocks, tokens, r.num_computed_tokens,
                                      r.num_scheduled_tokens)]
    read = worker.call("step", meta, writes, list(read_after_load))
    done = seed.drain(worker.get_finished, c.update_connector_output, c.stats, stored, loaded)
    worker.call("clear")
    return read, done


def test_seed003_across_two_processes():
    worker = Worker()
    try:
        # The scheduler's manager holds no KV: chunk_bytes 0, same page size and G2.
        with kvtier.Manager(page_size=seed.PAGE, num_layers=seed.LAYERS, num_outer=seed.OUTER,
                            chunk_bytes=0, g1_blocks=1, g2_blocks=50, g3_blocks=0) as m, \
                seed.connector(m, kvtier.ROLE_SCHEDULER) as c:
            assert c.get_num_new_matched_tokens("A", seed.TOKENS_A) == (0, False)
            c.update_state_after_alloc("A", [1, 2, 3], 0)
            remote_step(c, worker, [(S("A", 0, 40), [1, 2, 3], seed.TOKENS_A)], 2, 0)
            assert c.request_finished("A") is False

            assert c.get_num_new_matched_tokens("B", seed.TOKENS_B) == (32, False)
            c.update_state_after_alloc("B", [4, 5, 6, 7], 32)
            read, done = remote_step(c, worker, [(S("B", 32, 20), [4, 5, 6, 7], seed.TOKENS_B)],
                                     3, 2, read_after_load=[4, 5])
            assert read == [seed.kv(h) for h in HASH_A]  # A's bytes, through the child's G2
            assert done.finished_recving == []  # a synchronous load
            remote_step(c, worker, [(S("B", 52, 1, (), [3000]), [4, 5, 6, 7],
                                     seed.TOKENS_B + [3000])], 3, 2)
            assert c.request_finished("B") is False
            assert c.slot_state("A") == (kvtier.SLOT_FINISHED, STATES_A)
            assert c.slot_state("B") == (kvtier.SLOT_FINISHED, STATES_B)
            g2 = m.match_prefix(HASH_B, kvtier.G2)
            assert len(g2) == 3  # registered here ...
            m.release(g2)

            # ... and held by the child: C loads all three of B's blocks into fresh ones.
            tokens_c = seed.TOKENS_B[:48] + [4000]
            assert c.get_num_new_matched_tokens("C", tokens_c) == (48, False)
            c.update_state_after_alloc("C", [8, 9, 10, 11], 48)
            read, _ = remote_step(c, worker, [(S("C", 48, 1), [8, 9, 10, 11], tokens_c)], 3, 5,
                                  read_after_load=[8, 9, 10])
            assert read == [seed.kv(h) for h in HASH_B]
            assert c.request_finished("C") is False
    finally:
        worker.close()


# ---- bad input: a clear error from the call that caused it, every other request unharmed ----

def test_unknown_and_finished_ids_are_not_found():
    with seed.manager() as m, seed.connector(m) as c:
        for call in (lambda: c.update_state_after_alloc("nobody", [1], 0),
                     lambda: c.request_finished("nobody"),
                     lambda: c.request_preempted("nobody"),
                     lambda: c.slot_state("nobody"),
                     lambda: c.build_connector_meta([S("nobody", 0, 16)])):
            with pytest.raises(kvtier.NotFoundError) as e:
                call()
            assert e.value.status == kvtier.CONST["KVT_ERR_NOT_FOUND"] == -11
            assert e.value.message
        assert c.get_num_new_matched_tokens("A", seed.TOKENS_A) == (0, False)
        c.update_state_after_alloc("A", [1, 2, 3], 0)
        assert c.request_finished("A") is False
        with pytest.raises(kvtier.NotFoundError):  # a finished request takes no more calls
            c.update_state_after_alloc("A", [1, 2, 3], 0)


def test_corrupt_metadata_and_reports_are_refused():
    engine = seed.Engine()
    with seed.manager() as m, seed.connector(m) as c:
        c.register_kv_caches(engine.layout(), seed.NUM_GPU_BLOCKS)
        c.get_num_new_matched_tokens("A", seed.TOKENS_A)
        c.update_state_after_alloc("A", [1, 2, 3], 0)
        meta = c.build_connector_meta([S("A", 0, 40)])
        for bad in (meta[:len(meta) // 2], meta[:-1], b"", b"\xff" * 64, b"not msgpack"):
            with pytest.raises(kvtier.CorruptError) as e:
                c.bind_connector_metadata(bad)
            assert e.value.status == kvtier.CONST["KVT_ERR_CORRUPT"] and e.value.message
        for bad in (b"\xc1", b"\xff" * 64):
            with pytest.raises(kvtier.CorruptError):
                c.update_connector_output(bad)
        # Nothing was bound: the real metadata still runs the step.
        c.bind_connector_metadata(meta)
        c.start_load_kv()
        for layer in range(seed.LAYERS):
            c.wait_for_layer_load(layer)
        engine.forward(seed.completed([1, 2, 3], seed.TOKENS_A, 0, 40))
        for layer in range(seed.LAYERS):
            c.save_kv_layer(layer)
        c.wait_for_save()
        seed.drain(c.get_finished, c.update_connector_output, c.stats, 2, 0)
        c.clear_connector_metadata()


def test_wrong_half_closed_connector_and_bad_arguments():
    with seed.manager() as m:
        with seed.connector(m, kvtier.ROLE_SCHEDULER) as c:
            with pytest.raises(kvtier.StateError):
                c.start_load_kv()
            with pytest.raises(kvtier.StateError):  # a manager has at most one connector
                seed.connector(m)
            with pytest.raises(kvtier.InvalidArgumentError):
                c.get_num_new_matched_tokens(42, seed.TOKENS_A)
            with pytest.raises(kvtier.InvalidArgumentError):
                c.bind_connector_metadata("text is not bytes")
            with pytest.raises(kvtier.InvalidArgumentError):  # not a uint64_t
                c.get_num_new_matched_tokens("A", seed.TOKENS_A, -1)
            with pytest.raises(kvtier.InvalidArgumentError):
                c.wait_for_layer_load("layer 0")
            # C would read an id or a path cut at a NUL: two requests in one slot.
            with pytest.raises(kvtier.InvalidArgumentError, match="NUL"):
                c.get_num_new_matched_tokens("A\0B", seed.TOKENS_A)
            assert c.slots() == []
            with pytest.raises(kvtier.InvalidArgumentError, match="NUL"):
                m.record("/tmp/kvtier-log\0ignored")
        with pytest.raises(kvtier.InvalidHandleError):
            c.get_num_new_matched_tokens("A", seed.TOKENS_A)
        with pytest.raises(kvtier.InvalidArgumentError):
            kvtier.Connector(m, no_such_field=1)
        with seed.connector(m, kvtier.ROLE_WORKER) as w:  # the first one is gone
            with pytest.raises(kvtier.StateError):
                w.get_num_new_matched_tokens("A", seed.TOKENS_A)
    assert w.closed


def test_closing_the_manager_closes_its_connector_first():
    m = seed.manager()
    c = seed.connector(m)
    m.close()
    assert c.closed
    with pytest.raises(kvtier.InvalidHandleError):
        c.stats()


if __name__ == "__main__" and sys.argv[1:] == ["--worker"]:
    worker_main()
