"""The Python binding: real managers, real bytes, real threads. Run with
KVTIER_LIB_DIR=<build>/src /usr/bin/python3 -m pytest bindings/python/tests"""
import array
import asyncio
import gc
import os
import select
import subprocess
import sys
import threading

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import kvtier  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def manager(**kw):
    cfg = dict(page_size=4, num_layers=1, num_outer=2, chunk_bytes=64, g1_blocks=16,
               g2_blocks=16, g3_blocks=0)
    cfg.update(kw)
    return kvtier.Manager(**cfg)


def stored(m, hashes, fill=None):
    blocks = m.alloc(len(hashes))
    for i, b in enumerate(blocks):
        d = m.block_data(b)
        d[:] = bytes([(fill if fill is not None else i) & 0xFF]) * len(d)
    return m.register_hashes(blocks, hashes)


def test_version_and_status_classes():
    assert kvtier.version().startswith("0.")
    assert kvtier.CancelledError.status == -5
    assert issubclass(kvtier.CancelledError, kvtier.Error)
    assert issubclass(kvtier.TimeoutError, TimeoutError)
    assert len({c.status for c in (kvtier.InvalidArgumentError, kvtier.InvalidHandleError,
                                   kvtier.StateError, kvtier.NoSpaceError,
                                   kvtier.CancelledError, kvtier.IoError)}) == 6


def test_hashing_matches_incremental_and_accepts_buffers():
    tokens = list(range(1000, 1037))
    h = kvtier.hash_sequence(tokens, 4, b"salt")
    assert len(h) == 9 and isinstance(h, list)
    assert kvtier.hash_sequence(array.array("I", tokens), 4, b"salt") == h
    with kvtier.Seq(4, b"salt") as s:
        s.append(tokens[:5])
        s.append(array.array("I", tokens[5:]))
        assert s.hashes() == h
    assert kvtier.hash_sequence(tokens, 4, b"other") != h


def test_dedup_and_prefix_match():
    with manager() as m:
        a = stored(m, [1, 2, 3])
        again = m.alloc(1)
        (dup,) = m.register_hashes(again, [2], parent=1)
        assert dup == a[1]  # the existing block, one more reference
        assert m.tier_stats()["dedups"] == 1
        got = m.match_prefix(array.array("Q", [1, 2, 3, 4]))
        assert list(got) == list(a)
        assert m.block_info(a[0])["refs"] == 2
        m.release(got)
        m.release([dup])
        m.release(a)
        assert m.tier_stats()["inactive"] == 3
        m.check()


def test_offload_completion_through_the_event_fd_and_polling():
    with manager() as m:
        a = stored(m, [10, 11], fill=0x5A)
        list(m.events())
        with m.offload(a, kvtier.G2, user_data=77) as x:
            r, _, _ = select.select([m], [], [], 10)
            assert r == [m]
            done = []
            while not done:
                done = [e for e in m.poll() if e.type == kvtier.XFER_DONE]
            assert done[0].user_data == 77 and done[0].status == 0 and done[0].count == 2
            assert x.wait() == 2
        g2 = m.match_prefix([10, 11], kvtier.G2)
        assert len(g2) == 2
        assert bytes(m.block_data(g2[0])) == b"\x5a" * 128
        m.release(g2)
        m.release(a)


def test_offload_completion_with_asyncio():
    async def run():
        with manager() as m:
            a = stored(m, [20, 21, 22])
            list(m.events())
            x = m.offload(a, kvtier.G2, user_data=5)
            seen = []
            while not any(e.type == kvtier.XFER_DONE for e in seen):
                seen += await asyncio.wait_for(m.next_events(), 10)
            assert await x.wait_async() == 3
            x.close()
            m.release(a)
    asyncio.run(run())


def test_cancel_gives_cancelled_error_not_a_generic_failure():
    with manager(min_batch_size=1) as m:
        a = stored(m, [30])
        f = m.fence()
        x = m.offload(a, kvtier.G2, fence=f)
        x.cancel()
        with pytest.raises(kvtier.CancelledError) as e:
            x.wait()
        assert e.value.status == kvtier.CancelledError.status
        assert "cancel" in e.value.message
        assert len(m.match_prefix([30], kvtier.G2)) == 0
        f.close()
        x.close()
        m.release(a)
        m.check()


def test_reset_cancels_empties_and_keeps_held_bytes():
    with manager(min_batch_size=1) as m:
        a = stored(m, [50, 51], fill=9)
        with m.offload(a, kvtier.G2) as x:
            x.wait(5)
        b = stored(m, [52])  # not in G2: it waits for the fence
        f = m.fence()
        parked = m.offload(b, kvtier.G2, fence=f)
        list(m.events())
        m.reset()  # every tier
        with pytest.raises(kvtier.CancelledError):
            parked.wait(5)
        events = list(m.events())
        assert [e.tier for e in events if e.type == kvtier.TIER_CLEARED] == [kvtier.G1, kvtier.G2]
        assert sorted(e.hash for e in events
                      if e.type == kvtier.BLOCK_REMOVED and e.tier == kvtier.G2) == [50, 51]
        assert len([e for e in events if e.type == kvtier.XFER_DONE]) == 1
        assert m.match_prefix([50, 51]) == [] and m.match_prefix([50], kvtier.G2) == []
        assert bytes(m.block_data(a[0])) == bytes([9]) * len(m.block_data(a[0]))
        assert m.tier_stats(kvtier.G2)["free"] == 16
        m.reset(kvtier.G2)
        assert [e.type for e in m.events()] == [kvtier.TIER_CLEARED]
        with pytest.raises(kvtier.InvalidArgumentError) as e:
            m.reset(kvtier.G3)  # absent
        assert "absent" in e.value.message
        with pytest.raises(kvtier.InvalidArgumentError):
            m.reset(7)
        parked.close()
        f.close()
        m.release(a + b)
        assert m.tier_stats()["free"] == 16
        m.check()


def test_onboard_swaps_in_the_existing_block_and_wait_times_out():
    with manager() as m:
        a = stored(m, [40, 41], fill=7)
        with m.offload(a, kvtier.G2) as x:
            x.wait(5)
        src = m.match_prefix([40, 41], kvtier.G2)
        dst = m.alloc(2)
        with m.onboard(src, dst) as x:
            x.wait()
            final = x.blocks()
        assert list(final) == list(a)  # G1 still held them: dedup
        m.release(src)
        m.release(a)
        m.release(final)
        fresh = stored(m, [42])  # not in G2 yet, so it reaches the fence
        f = m.fence()
        with m.offload(fresh, kvtier.G2, fence=f) as x:
            with pytest.raises(kvtier.TimeoutError):
                x.wait(0.01)
            f.signal()
            assert x.wait(5) == 1
        f.close()
        m.release(fresh)
        m.check()


def test_bad_input_raises_typed_errors_with_status_and_message():
    with manager() as m:
        with pytest.raises(kvtier.InvalidHandleError) as e:
            m.release([12345])
        assert e.value.status == -2 and "0x3039" in e.value.message
        with pytest.raises(kvtier.InvalidHandleError):
            m.block_data(0)
        with pytest.raises(kvtier.InvalidArgumentError):
            m.alloc(1, tier=7)
        with pytest.raises(kvtier.InvalidArgumentError):
            m.release("not blocks")
        with pytest.raises(kvtier.InvalidArgumentError):
            m.register_hashes(m.alloc(1), [-1])
        with pytest.raises(kvtier.NoSpaceError):
            m.alloc(1000)
        with pytest.raises(kvtier.StateError):
            m.retain(m.alloc(1)[0])
        with pytest.raises(kvtier.InvalidArgumentError):
            m.offload([], kvtier.G2, fence="not a fence")
    with pytest.raises(kvtier.InvalidArgumentError) as e:
        kvtier.Manager(page_size=3)
    assert "page_size" in e.value.message
    with pytest.raises(kvtier.InvalidArgumentError):
        kvtier.Manager(no_such_field=1)


def test_closed_manager_and_any_release_order():
    m = manager()
    a = stored(m, [50])
    f = m.fence()
    x = m.offload(a, kvtier.G2, fence=f)
    m.close()  # before its transfer and fence
    with pytest.raises(kvtier.InvalidHandleError):
        m.alloc(1)
    with pytest.raises(kvtier.InvalidHandleError):
        x.wait()
    with pytest.raises(kvtier.InvalidHandleError):
        f.signal()
    x.close()
    f.close()
    m.close()  # twice is fine


def test_with_block_after_an_error_frees_everything():
    with pytest.raises(RuntimeError):
        with manager() as m:
            stored(m, [60, 61])
            m.offload(m.match_prefix([60]), kvtier.G2)
            raise RuntimeError("the engine failed")
    assert m.closed  # the manager, its blocks and its transfer were destroyed on the way out
    with pytest.raises(kvtier.InvalidHandleError):
        m.alloc(1)
    gc.collect()


def test_threads_share_one_manager():
    with manager(g1_blocks=512, g2_blocks=512) as m:
        errors = []

        def worker(k):
            try:
                for i in range(50):
                    base = k * 1000 + i * 4
                    hs = [base + 1, base + 2, base + 3]
                    blocks = stored(m, hs)
                    assert list(m.match_prefix(hs)) == list(blocks)
                    with m.offload(blocks, kvtier.G2) as x:
                        x.wait()
                    m.release(blocks)
                    m.release(blocks)
            except Exception as e:  # pragma: no cover - reported below
                errors.append(e)

        threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        m.check()


def test_thousands_of_blocks_per_call():
    with manager(page_size=16, g1_blocks=8192, chunk_bytes=0) as m:
        tokens = array.array("I", range(16 * 5000))
        hashes = kvtier.hash_sequence(tokens, 16, b"big")
        blocks = m.register_hashes(m.alloc(5000), hashes)
        got = m.match_prefix(hashes)
        assert len(got) == 5000
        m.release(got)
        m.release(blocks)


def test_the_scenario_prints_what_c_prints():
    out = subprocess.run([sys.executable, os.path.join(HERE, "..", "examples", "scenario.py")],
                         capture_output=True, text=True, check=True).stdout
    assert "request B: 26 tokens, 6 full blocks, G1 hit 0, G2 hit 3, onboarded 3" in out
    assert "onboarded bytes equal request A's: yes" in out


def test_priorities_and_pins_decide_what_is_evicted():
    with manager(g1_blocks=8, max_pinned_percent=25,
                 eviction=[kvtier.EVICT_LRU, kvtier.EVICT_S3FIFO, kvtier.EVICT_LRU]) as m:
        blocks = stored(m, [1, 2, 3, 4])
        m.release(blocks)                            # one call: the last evicted first
        m.set_priority([blocks[0]], 3)
        m.set_priority([blocks[2]], -1)
        assert [m.block_info(b)["seq_hash"] for b in m.evictable()] == [3, 4, 2, 1]
        m.pin(blocks[1:2] * 2)                       # listed twice, pinned once
        assert m.tier_stats()["pinned"] == 1
        assert [m.block_info(b)["seq_hash"] for b in m.evictable()] == [3, 4, 1]
        with pytest.raises(kvtier.NoSpaceError, match="max_pinned_percent"):
            m.pin(blocks[2:4])                       # 3 of 8 is past 25 %: none pinned
        assert m.tier_stats()["pinned"] == 1
        m.alloc(7)                                   # evicts all but the pinned one
        assert m.match_prefix([2]) == [blocks[1]]
        with pytest.raises(kvtier.InvalidHandleError):
            m.pin([blocks[0]])                       # evicted
        m.unpin([blocks[1]])
        assert m.tier_stats()["pinned"] == 0
        m.release([blocks[1]])
        assert m.evictable() == [blocks[1]]
        with pytest.raises(kvtier.StateError):
            m.set_priority(m.alloc(1), 1)            # not registered
        with pytest.raises(kvtier.InvalidArgumentError):
            m.set_priority([blocks[1]], 2**31)
        m.check()
