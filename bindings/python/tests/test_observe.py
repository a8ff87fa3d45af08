"""The observe stream from Python: a subscription sees a tier's registrations and evictions
in sequence, the event log holds the same events, the metrics text and the registry's hashes
say what the tier holds. Run with KVTIER_LIB_DIR=<build>/src."""
import os
import select
import sys

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
