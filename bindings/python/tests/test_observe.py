"""The observe stream from Python: a subscription sees a tier's registrations and evictions
in sequence, the event log holds the same events, the metrics text and the registry's hashes
say what the tier holds. Run with KVTIER_LIB_DIR=<build>/src."""
import asyncio
import gc
import json
import os
import select
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
import kvtier  # noqa: E402
import connector_seed003 as seed  # noqa: E402


def test_subscription_log_metrics_and_hashes(tmp_path):
    m = kvtier.Manager(page_size=4, num_layers=1, num_outer=2, chunk_bytes=64, g1_blocks=4,
                       g2_blocks=4, g3_blocks=0)
    sub = m.subscribe(capacity=1000)
    log = tmp_path / "run.kvtlog"
    m.record(log)
    assert select.select([sub.fileno()], [], [], 0)[0] == []
    hashes = list(range(101, 107))  # six blocks through a G1 of four: two evictions
    for h in hashes:
        b = m.alloc(1)
        m.release([m.register_hash(b[0], h)])
    m.stop_recording()
    assert select.select([sub.fileno()], [], [], 0)[0] == [sub.fileno()]
    ev = sub.drain()
    assert [e["seq"] for e in ev] == list(range(1, len(ev) + 1))
    stored = [e["hash"] for e in ev if e["kind"] == "BLOCK_STORED"]
    removed = [e["hash"] for e in ev if e["kind"] == "BLOCK_REMOVED"]
    assert stored == hashes and removed == [101, 102]
    assert all(e["dst"] == kvtier.G1 for e in ev)
    # The library's JSON of an event (kvt_obs_event_json): names, not numbers.
    assert json.loads(ev[0].to_json()) == {
        "seq": ev[0].seq, "time_ns": ev[0].time_ns, "kind": "BLOCK_STORED", "parent_hash": 0,
        "hash": 101, "tier": "G1"}
    logged = list(kvtier.EventLog(log))
    assert logged == ev
    assert sorted(m.tier_hashes(kvtier.G1)) == [103, 104, 105, 106]
    text = m.metrics_text()
    assert 'kvtier_tier_blocks{tier="G1",state="inactive"} 4' in text
    assert 'kvtier_tier_evictions_total{tier="G1"} 2' in text
    sub.close()
    m.close()

    cut = tmp_path / "cut.kvtlog"
    cut.write_bytes(log.read_bytes()[:-7])
    it = kvtier.EventLog(cut)
    assert len(list(it)) == len(ev) - 1 and it.torn and "the log is cut there" in it.why


def test_connector_breakpoint_endpoint_and_rerun(tmp_path):
    """A connector whose config serves the management endpoint: a breakpoint on a request
    pauses its call on the engine's thread, inspection (here and over the socket) answers
    from the pause, resume lets it go on. The recorded calls, made again on a fresh
    connector, end in the same slots; on a connector with fewer G1 blocks they do not."""
    import json
    import socket
    import threading
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                    "examples"))
    import connector_seed003 as seed
    sock, log = str(tmp_path / "k.sock"), tmp_path / "run.kvtlog"
    cfg = dict(role=kvtier.ROLE_SCHEDULER, num_gpu_blocks=seed.NUM_GPU_BLOCKS)
    with seed.manager() as m, kvtier.Connector(m, endpoint_path=sock, pause_timeout_ms=20000,
                                               **cfg) as c:
        assert os.path.exists(sock)
        m.record(log)
        assert c.get_num_new_matched_tokens("A", seed.TOKENS_A, 0) == (0, False)
        assert c.wait_paused(10) is None
        with pytest.raises(kvtier.StateError):
            c.resume()
        bp = c.add_breakpoint(req_id="A")
        engine = threading.Thread(target=c.update_state_after_alloc, args=("A", [1, 2, 3], 0))
        engine.start()
        p = c.wait_paused(10000)
        assert p["req_id"] == "A" and p["breakpoint"] == bp
        assert p["trigger"] == kvtier.C.KVT_TRIGGER_UPDATE_STATE_AFTER_ALLOC
        assert [(s["req_id"], s["state"]) for s in c.slots()] == [("A", kvtier.SLOT_INITIALIZED)]
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(sock)
            s.sendall(b'{"cmd": "slots"}\n')
            reply = json.loads(s.makefile().readline())
        assert [x["req_id"] for x in reply["slots"]] == ["A"], reply
        c.resume()
        engine.join(10)
        assert not engine.is_alive()
        c.remove_breakpoint(bp)
        with pytest.raises(kvtier.NotFoundError):
            c.remove_breakpoint(bp)
        assert c.batches() == []
        m.stop_recording()
        live = [(s["req_id"], s["state"], s["tokens"]) for s in c.slots()]
    assert not os.path.exists(sock)

    with seed.manager() as m2, kvtier.Connector(m2, **cfg) as fresh:
        r = fresh.rerun(log)
        assert r["calls"] == 2 and r["violations"] == 0 and r["live_slots"] == 1
        assert [(s["req_id"], s["state"], s["tokens"]) for s in fresh.slots()] == live
    with seed.manager() as m3, kvtier.Connector(m3, role=kvtier.ROLE_SCHEDULER,
                                                num_gpu_blocks=3) as small:
        with pytest.raises(kvtier.CorruptError) as e:
            small.rerun(log)  # block id 3 is out of its range: the alloc fails here
        assert "UPDATE_STATE_AFTER_ALLOC 'A'" in e.value.message, e.value.message


def small_manager():
    return kvtier.Manager(page_size=4, num_layers=1, num_outer=2, chunk_bytes=64, g1_blocks=4,
                          g2_blocks=4, g3_blocks=0)


def register(m, hashes):
    for h in hashes:
        m.release([m.register_hash(m.alloc(1)[0], h)])


def test_recorder_ring_dump_and_replay(tmp_path):
    ring = tmp_path / "ring.kvtlog"
    with small_manager() as m:
        m.record_ring(100)
        register(m, [201, 202, 203])
        m.dump_ring(ring)
    with kvtier.EventLog(ring) as log:
        events = list(log)
    assert [(e.kind, e.hash, e.dst) for e in events] == [
        (kvtier.ObsKind.BLOCK_STORED, h, kvtier.G1) for h in (201, 202, 203)]
    assert events[0].kind == "BLOCK_STORED" and events[0]["hash"] == 201
    assert log.closed

    assert kvtier.replay_log(ring).events == 3  # the checks alone, no manager
    with small_manager() as fresh:
        r = kvtier.replay_log(str(ring), fresh)
        assert (r.events, r.violations, r.registered[kvtier.G1], r.torn) == (3, 0, 3, 0)
        assert sorted(fresh.tier_hashes(kvtier.G1)) == [201, 202, 203]
        with pytest.raises(kvtier.CorruptError) as e:  # each hash stored twice now
            kvtier.replay_log(ring, fresh)
        assert e.value.replay.violations == 3


def test_awaiting_the_observe_stream_and_the_event_fd():
    async def run():
        with small_manager() as m, m.subscribe(100) as sub:
            with pytest.raises(asyncio.TimeoutError):
                await sub.wait_async(timeout=0.01)
            loop = asyncio.get_running_loop()
            loop.call_soon(register, m, [301])
            (e,) = await asyncio.wait_for(sub.wait_async(), 10)
            assert (e.kind, e.hash) == (kvtier.ObsKind.BLOCK_STORED, 301)
            polled = await asyncio.wait_for(m.poll_async(), 10)
            assert [(p.type, p.hash) for p in polled] == [(kvtier.BLOCK_STORED, 301)]
            (b,) = m.match_prefix([301])
            with m.offload([b], kvtier.G2, user_data=9) as x:  # its release withdraws events
                assert await asyncio.wait_for(x.wait_async(), 10) == 1
                done = []
                while not done:
                    done = [p for p in await m.poll_async(timeout=10)
                            if p.type == kvtier.XFER_DONE]
            assert done[0].user_data == 9 and done[0].tier is kvtier.G2
            m.release([b])
    asyncio.run(run())


def test_connector_hooks_see_calls_and_transitions():
    calls, transitions = [], []
    with seed.manager() as m, kvtier.Connector(m, role=kvtier.ROLE_SCHEDULER,
                                               num_gpu_blocks=8) as c:
        c.set_hooks(will_call=lambda t, r: calls.append(("will", t, r)),
                    finished_call=lambda t, r, st: calls.append(("done", t, r, st)),
                    transition=lambda *a: transitions.append(a))
        gc.collect()  # the callbacks live as long as the connector holds them
        T = kvtier.ObsTrigger
        c.get_num_new_matched_tokens("A", seed.TOKENS_A)
        c.build_connector_meta([])
        assert calls == [("will", T.GET_NUM_NEW_MATCHED_TOKENS, "A"),
                         ("done", T.GET_NUM_NEW_MATCHED_TOKENS, "A", 0),
                         ("will", T.BUILD_CONNECTOR_META, None),
                         ("done", T.BUILD_CONNECTOR_META, None, 0)]
        assert transitions == [("A", 0, kvtier.SLOT_INITIALIZED, T.GET_NUM_NEW_MATCHED_TOKENS)]
        with pytest.raises(kvtier.InvalidArgumentError):
            c.update_state_after_alloc("A", [1, 2, 3], 999)
        assert calls[-1][:3] == ("done", T.UPDATE_STATE_AFTER_ALLOC, "A") and calls[-1][3] < 0
        c.set_hooks(transition=lambda *a: transitions.append(a))  # replaces all three
        c.request_finished("A")
        assert len(calls) == 6 and [t[2] for t in transitions[1:]] == [
            kvtier.SLOT_FINISHING, kvtier.SLOT_FINISHED]
        c.set_hooks()
        c.get_num_new_matched_tokens("B", seed.TOKENS_B)
        assert len(transitions) == 3
