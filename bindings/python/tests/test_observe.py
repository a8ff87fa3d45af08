"""The observe stream from Python: a subscription sees a tier's registrations and evictions
in sequence, the event log holds the same events, the metrics text and the registry's hashes
say what the tier holds. Run with KVTIER_LIB_DIR=<build>/src."""
import os
import select
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import kvtier  # noqa: E402


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
