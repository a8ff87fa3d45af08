"""The calls 0.5.0 gave docs/CONVENTIONS.md's argument order and codes, from Python: the
binding's methods over them, and what their new semantics add (a count beyond the cap,
KVT_ITEROVER at the end of an event log, KVT_TIMEOUT from a pause wait). The raw calls run
through kvtier.C, next to the deprecated forms they replace, which keep their behaviour.
Run with KVTIER_LIB_DIR=<build>/src."""
import os
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))
import kvtier  # noqa: E402
import connector_seed003 as seed  # noqa: E402
from kvtier import C, CONST, ffi  # noqa: E402
from test_close_threads import JOIN_S, joined, run  # noqa: E402

SENTINEL = 0xDEADBEEFDEADBEEF


def small_manager(**kw):
    cfg = dict(page_size=4, num_layers=1, num_outer=2, chunk_bytes=64, g1_blocks=8,
               g2_blocks=8, g3_blocks=0)
    cfg.update(kw)
    return kvtier.Manager(**cfg)


def last_error():
    return ffi.string(C.kvt_last_error()).decode()


def test_iterover_is_a_positive_outcome_not_an_error():
    assert CONST["KVT_ITEROVER"] == 3
    assert ffi.string(C.kvt_status_str(CONST["KVT_ITEROVER"])) == b"KVT_ITEROVER"
    from kvtier import _errors
    assert (_errors.OK, _errors.AGAIN, _errors.TIMEOUT, _errors.ITEROVER) == (0, 1, 2, 3)
    # Like KVT_AGAIN, no Error subclass stands for it: the calls that return it handle it.
    assert _errors.ITEROVER not in _errors._BY_STATUS
    assert _errors.AGAIN not in _errors._BY_STATUS
    assert _errors._BY_STATUS[_errors.TIMEOUT] is kvtier.TimeoutError


def test_event_log_reads_to_the_end_and_stays_there(tmp_path):
    path = tmp_path / "run.kvtlog"
    with small_manager() as m:
        m.record(path)
        for h in (301, 302, 303):
            m.release([m.register_hash(m.alloc(1)[0], h)])
        m.stop_recording()
    with kvtier.EventLog(path) as log:
        events = list(log)
        assert [(e.kind, e.hash) for e in events] == [
            (kvtier.ObsKind.BLOCK_STORED, h) for h in (301, 302, 303)]
        assert list(log) == [] and not log.torn  # past the end, and still not torn
        e = ffi.new("kvt_obs_event *")
        with log._using() as h:
            # kvt_event_log_read: KVT_ITEROVER past the last record, on every call after.
            assert C.kvt_event_log_read(e, h) == CONST["KVT_ITEROVER"]
            assert C.kvt_event_log_read(e, h) == CONST["KVT_ITEROVER"]
            # The deprecated form keeps its KVT_ERR_NOT_FOUND.
            assert C.kvt_event_log_next(h, e) == CONST["KVT_ERR_NOT_FOUND"]
    with kvtier.EventLog(path) as log, log._using() as h:  # record by record, raw
        e = ffi.new("kvt_obs_event *")
        got = []
        while (st := C.kvt_event_log_read(e, h)) == kvtier.OK:
            got.append(e.hash)
        assert st == CONST["KVT_ITEROVER"] and got == [301, 302, 303]


def test_evictable_counts_all_and_lists_the_first_cap():
    with small_manager() as m:
        blocks = m.register_hashes(m.alloc(5), [1, 2, 3, 4, 5])
        m.release(blocks)
        every = m.evictable()
        assert sorted(every) == sorted(blocks) and len(every) == 5
        assert m.evictable(2) == every[:2]  # the first two in eviction order
        assert m.evictable(0) == []
        assert m.evictable(100) == every

        n = ffi.new("size_t *")
        out = ffi.new("kvt_block[]", [SENTINEL] * 4)
        with m._using() as h:
            # NULL and 0 ask for the count; a smaller cap still reports all of them.
            assert C.kvt_tier_evictable_blocks(ffi.NULL, 0, n, h, kvtier.G1) == kvtier.OK
            assert n[0] == 5
            assert C.kvt_tier_evictable_blocks(out, 2, n, h, kvtier.G1) == kvtier.OK
            assert n[0] == 5 and list(out[0:2]) == every[:2]
            assert list(out[2:4]) == [SENTINEL] * 2  # beyond cap: not written
            # The deprecated form counts what it wrote.
            assert C.kvt_tier_evictable(n, out, 2, h, kvtier.G1) == kvtier.OK and n[0] == 2

        m.pin([every[0]])  # pinned blocks are neither listed nor counted
        assert m.evictable() == every[1:]
        with m._using() as h:
            assert C.kvt_tier_evictable_blocks(ffi.NULL, 0, n, h, kvtier.G1) == kvtier.OK
        assert n[0] == 4
        with pytest.raises(kvtier.InvalidArgumentError):
            m.evictable(tier=kvtier.G4)


def test_hash_tokens_with_a_small_cap_hashes_the_first_blocks():
    tokens = list(range(18))  # four full blocks of 4 and a partial one
    salt = kvtier.hash_salt(b"cap")
    want = kvtier.hash_sequence(tokens, 4, salt)
    assert len(want) == 4 and len(set(want)) == 4
    assert kvtier.hash_sequence(tokens[:16], 4, salt) == want  # the partial block has none
    assert kvtier.hash_sequence(tokens[:3], 4, salt) == []
    assert kvtier.hash_sequence([], 4, salt) == []
    with pytest.raises(kvtier.InvalidArgumentError):
        kvtier.hash_sequence(tokens, 0, salt)

    toks = ffi.new("uint32_t[]", tokens)
    n = ffi.new("size_t *")
    out = ffi.new("uint64_t[]", [SENTINEL] * 4)
    assert C.kvt_hash_tokens(ffi.NULL, 0, n, salt, toks, len(tokens), 4) == kvtier.OK
    assert n[0] == 4
    # A cap below the number of blocks is no error: the first cap hashes, and the count.
    assert C.kvt_hash_tokens(out, 2, n, salt, toks, len(tokens), 4) == kvtier.OK
    assert n[0] == 4 and list(out[0:2]) == want[:2] and list(out[2:4]) == [SENTINEL] * 2
    # The deprecated form refuses it, writing nothing but the count.
    out[0] = SENTINEL
    n[0] = 0
    assert C.kvt_hash_sequence(out, n, 2, salt, toks, len(tokens), 4) == \
        CONST["KVT_ERR_INVALID_ARGUMENT"]
    assert n[0] == 4 and out[0] == SENTINEL


def test_seq_counts_blocks_from_first_and_copies_the_first_cap():
    salt = kvtier.hash_salt(b"seq")
    tokens = list(range(18))
    want = kvtier.hash_sequence(tokens, 4, salt)
    with kvtier.Seq(4, salt) as s:
        assert s.info() == (0, 0) and s.hashes() == []
        s.append(tokens[:7])
        s.append(tokens[7:])
        assert s.info() == (18, 4)
        assert s.hashes() == want
        assert s.hashes(1) == want[1:] and s.hashes(3) == want[3:]
        assert s.hashes(4) == []  # first at the end
        with pytest.raises(kvtier.InvalidArgumentError):
            s.hashes(5)  # beyond it

        n = ffi.new("size_t *")
        blk = ffi.new("uint64_t[]", [SENTINEL] * 3)
        seq = ffi.new("uint64_t[]", [SENTINEL] * 3)
        with s._using() as h:
            assert C.kvt_seq_copy_hashes(ffi.NULL, ffi.NULL, 0, n, h, 1) == kvtier.OK
            assert n[0] == 3
            assert C.kvt_seq_copy_hashes(blk, seq, 2, n, h, 1) == kvtier.OK
            assert n[0] == 3  # complete from block 1 on, though 2 were copied
            assert list(seq[0:2]) == want[1:3] and seq[2] == SENTINEL
            assert blk[2] == SENTINEL and SENTINEL not in list(blk[0:2])
            # The block hashes are the unchained ones: not the sequence hashes.
            assert list(blk[0:2]) != list(seq[0:2])
            # The deprecated form counts what it copied.
            assert C.kvt_seq_hashes(n, ffi.NULL, seq, h, 1, 2) == kvtier.OK and n[0] == 2
        s.append(range(18, 20))  # completes block 4
        assert s.info() == (20, 5) and s.hashes(4) == kvtier.hash_sequence(range(20), 4, salt)[4:]
    with pytest.raises(kvtier.InvalidHandleError):
        s.info()


def test_take_events_drains_up_to_max_in_order():
    with small_manager() as m, kvtier.Connector(m, role=kvtier.ROLE_SCHEDULER,
                                                num_gpu_blocks=8) as c:
        blocks = m.register_hashes(m.alloc(3), [11, 12, 13])
        with m.offload(blocks, kvtier.G2) as x:
            x.wait()
        m.release(blocks)
        first = c.take_events(1)
        rest = c.take_events()
        assert len(first) == 1 and c.take_events() == []  # moved, not copied
        events = first + rest
        assert all(e.type == kvtier.BLOCK_STORED for e in events)
        assert [e.hash for e in events if e.tier == kvtier.G2] == [11, 12, 13]
        buf = ffi.new("kvt_event[]", 4)
        with c._using() as h:
            assert C.kvt_connector_drain_events(h, buf, 4) == 0
        assert C.kvt_connector_drain_events(ffi.NULL, buf, 4) == 0  # a bad handle: 0
        assert last_error().startswith("kvt_connector_drain_events")


def scheduler():
    m = seed.manager()
    c = kvtier.Connector(m, role=kvtier.ROLE_SCHEDULER, num_gpu_blocks=seed.NUM_GPU_BLOCKS,
                         pause_timeout_ms=JOIN_S * 1000)
    assert c.get_num_new_matched_tokens("A", seed.TOKENS_A, 0) == (0, False)
    return m, c


def test_pause_wait_times_out():
    m, c = scheduler()
    with m, c:
        t0 = time.monotonic()
        assert c.wait_paused(0) is None  # only looks
        assert c.wait_paused(50) is None
        assert time.monotonic() - t0 >= 0.045
        with pytest.raises(kvtier.TimeoutError) as e:
            c.pause_wait(0)
        assert e.value.status == CONST["KVT_TIMEOUT"] and isinstance(e.value, TimeoutError)
        t0 = time.monotonic()
        with pytest.raises(kvtier.TimeoutError, match="within 0.25 s"):
            c.pause_wait(0.25)  # longer than one of its library waits
        assert time.monotonic() - t0 >= 0.24
        with pytest.raises(kvtier.InvalidArgumentError):
            c.pause_wait(-1)
        with pytest.raises(OverflowError):  # a uint32_t of milliseconds, as always
            c.wait_paused(-1)
        p = ffi.new("kvt_pause_info *")
        p.struct_size = ffi.sizeof("kvt_pause_info")
        with c._using() as h:
            assert C.kvt_connector_pause_wait(p, h, 0) == CONST["KVT_TIMEOUT"]
            assert last_error().startswith("kvt_connector_pause_wait")
            # The deprecated form keeps its KVT_AGAIN.
            assert C.kvt_connector_wait_paused(p, h, 0) == CONST["KVT_AGAIN"]


def test_pause_wait_forever_gets_a_later_pause():
    m, c = scheduler()
    with m, c:
        bp = c.add_breakpoint(req_id="A")
        waiter, waited = run(c.pause_wait, "waiter")  # timeout None: forever
        while not c._gate.calls and waiter.is_alive():  # until the wait is in flight
            pass
        time.sleep(0.3)  # past several of its library waits: it is still waiting
        assert waiter.is_alive() and waited == {}
        engine, called = run(lambda: c.update_state_after_alloc("A", [1, 2, 3], 0), "engine")
        joined(waiter)
        p = waited["value"]
        assert isinstance(p, kvtier.PauseInfo)
        assert p.req_id == "A" and p.breakpoint == bp
        assert p.trigger == kvtier.C.KVT_TRIGGER_UPDATE_STATE_AFTER_ALLOC
        # A thread still paused: a wait of 0 s, and the millisecond form, see it at once.
        assert c.pause_wait(0).pauses == p.pauses
        assert c.wait_paused(0).req_id == "A"
        c.resume()
        joined(engine)
        assert called == {"value": None}
        with pytest.raises(kvtier.TimeoutError):
            c.pause_wait(0)  # resumed: nothing is paused any more


def test_close_ends_a_pause_wait_forever():
    """Nothing in the library ends a wait for a pause but a pause: pause_wait() waits in
    slices, so that a close() meanwhile ends it within one rather than hang."""
    m, c = scheduler()
    waiter, waited = run(c.pause_wait, "waiter")
    while not c._gate.calls and waiter.is_alive():
        pass
    t0 = time.monotonic()
    c.close()
    assert time.monotonic() - t0 < 5
    joined(waiter)
    assert isinstance(waited.get("error"), kvtier.InvalidHandleError), waited
    assert c.closed and c._gate.calls == []
    m.close()
