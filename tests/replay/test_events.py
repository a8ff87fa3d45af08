"""Seeing inside a kvtier-replay run: --record writes an event log, kvtier-events reads it
back, a recording killed at random moments still reads back to its last whole record, and
--metrics-port serves Prometheus text that prometheus_client parses. Run by ctest with
KVTIER_REPLAY and KVTIER_EVENTS set."""
import collections
import json
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
REPLAY = os.environ.get("KVTIER_REPLAY", str(ROOT / "build" / "bin" / "kvtier-replay"))
EVENTS = os.environ.get("KVTIER_EVENTS", str(ROOT / "build" / "bin" / "kvtier-events"))
TRACE = ROOT / "examples" / "traces" / "conversation_trace.jsonl"
TINY = ["--chunk-bytes", "64", "--no-progress"]


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    path = tmp_path_factory.mktemp("trace") / "prefix.jsonl"
    with open(TRACE) as f:
        path.write_text("".join(line for _, line in zip(range(600), f)))
    return path


def replay_json(*args):
    p = subprocess.run([REPLAY, *map(str, args), "--json"], capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def events(*args, rc=0):
    p = subprocess.run([EVENTS, *map(str, args)], capture_output=True, text=True, timeout=600)
    assert p.returncode == rc, p.stderr
    return p


def events_json(log):
    p = events(log, "--json")
    return [json.loads(line) for line in p.stdout.splitlines()], p.stderr


def check_sequence(ev):
    assert [e["seq"] for e in ev] == list(range(1, len(ev) + 1)), "a gap in the sequence"
    times = [e["time_ns"] for e in ev]
    assert times == sorted(times)


def test_an_engine_run_is_recorded_event_by_event(trace, tmp_path):
    log = tmp_path / "engine.kvtlog"
    r = replay_json("--trace", trace, "--mode", "engine", "--g1-blocks", 400, "--max-running",
                    32, "--record", log, *TINY)
    ev, err = events_json(log)
    assert err == ""
    check_sequence(ev)
    # Every slot transition the connector counted, and no other.
    seen = collections.Counter(
        f"{'NONE' if e['from'] == '-' else e['from']}->{e['to']}" for e in ev
        if e["kind"] == "SLOT")
    assert seen == collections.Counter({k: v for k, v in r["slot_transitions"].items() if v})
    # Each request's slot ends FINISHED, and its events follow its history.
    last = {}
    for e in ev:
        if e["kind"] == "SLOT":
            assert last.get(e["req_id"], "-") == e["from"], e
            last[e["req_id"]] = e["to"]
    assert set(last.values()) == {"FINISHED"} and len(last) == 600
    # The worker's transfers, as kvt_transfer_stats counts them.
    for d, (src, dst) in {"G1->G2": ("G1", "G2"), "G2->G1": ("G2", "G1")}.items():
        blocks = sum(e["blocks"] for e in ev
                     if e["kind"] == "TRANSFER" and e["src"] == src and e["dst"] == dst)
        assert blocks == r["transfers"][d]["blocks"] > 0, d
    # Every promoted batch ends exactly once.
    ends = collections.Counter()
    promoted = set()
    for e in ev:
        if e["kind"] == "CANDIDATE" and e["batch"]:
            if e["state"] == "PROMOTED":
                promoted.add(e["batch"])
            elif e["state"] in ("COMPLETED", "FAILED", "CANCELLED"):
                ends[e["batch"]] += 1
    assert promoted and set(ends) == promoted and set(ends.values()) == {1}
    # G2 registered each stored block once.
    stored = [e for e in ev if e["kind"] == "BLOCK_STORED" and e["tier"] == "G2"]
    assert len(stored) == r["stored_blocks"]


def test_a_blocks_run_records_the_pipelines_transfers(trace, tmp_path):
    log = tmp_path / "blocks.kvtlog"
    r = replay_json("--trace", trace, "--g1-blocks", 300, "--g2-blocks", 600, "--g3-blocks",
                    3000, "--g3-path", tmp_path, "--record", log, *TINY)
    ev, _ = events_json(log)
    check_sequence(ev)
    for d, x in r["transfers"].items():
        src, dst = d.split("->")
        mine = [e for e in ev if e["kind"] == "TRANSFER" and e["src"] == src and e["dst"] == dst]
        ok = [e for e in mine if e["status"] == "KVT_OK"]
        assert len(ok) == x["transfers"], d
        assert sum(e["blocks"] for e in ok) == x["blocks"], d
        assert len(mine) - len(ok) == x["cancelled"] + x["failed"], d


def test_one_requests_timeline(trace, tmp_path):
    log = tmp_path / "engine.kvtlog"
    replay_json("--trace", trace, "--mode", "engine", "--record", log, *TINY)
    out = events(log, "--request", "req-3").stdout.splitlines()
    assert out[0] == "request req-3"
    assert out[-1].startswith("time per state:") and "PREFILLING" in out[-1]
    body = out[1:-1]
    assert body and all(" req-3 " in line for line in body)
    assert "INITIALIZED" in body[0]
    slots = [line for line in body if " SLOT " in line]
    assert "FINISHING -> FINISHED" in slots[-1]
    calls = [line for line in body if " CALL " in line]
    assert "GET_NUM_NEW_MATCHED_TOKENS  KVT_OK  tokens 2290" in calls[0], calls
    assert "REQUEST_FINISHED  KVT_OK" in calls[-1], calls
    j = [json.loads(line) for line in events(log, "--json", "--request", "req-3").stdout.splitlines()]
    assert len(j) == len(body) and {e["req_id"] for e in j} == {"req-3"}
    p = events(log, "--request", "no-such-request", rc=1)
    assert "no event names request 'no-such-request'" in p.stderr


def test_what_is_not_a_log_is_refused(tmp_path):
    junk = tmp_path / "junk"
    junk.write_bytes(os.urandom(4096))
    assert "not a kvtier event log" in events(junk, rc=2).stderr
    assert "cannot open" in events(tmp_path / "missing", rc=2).stderr


def test_a_recording_killed_at_random_moments_reads_back_to_its_last_whole_record(tmp_path):
    rng = random.Random(13)
    read = 0
    for i in range(12):
        log = tmp_path / f"killed{i}.kvtlog"
        p = subprocess.Popen([REPLAY, "--trace", TRACE, "--mode", "engine", "--record", log,
                              *TINY], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.05, 0.8))
        p.send_signal(signal.SIGKILL)
        assert p.wait() == -signal.SIGKILL, "the run ended before the kill"
        if not log.exists() or log.stat().st_size < 16:
            continue  # killed before the header was written: nothing to read
        p = events(log, "--json")  # exits 0, also where it cut a torn tail
        assert p.stderr == "" or "the log is cut there" in p.stderr, p.stderr
        lines = p.stdout.splitlines()
        # {"seq":N,... on every line: 1..n without a gap.
        assert [int(line[7:line.index(",")]) for line in lines] == list(range(1, len(lines) + 1))
        read += len(lines) > 0
        log.unlink()
    assert read >= 6, "too few kills landed after the first records"


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port, path="/metrics"):
    import urllib.error
    import urllib.request
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.headers.get("Content-Type"), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, None, e.read().decode()


def g1g2_buckets(samples):
    """The G1 -> G2 copy-duration histogram's bucket counts, in order."""
    return [v for l, v in samples.get("kvtier_transfer_duration_seconds", [])
            if l.get("src") == "G1" and l.get("dst") == "G2" and "le" in l]


def test_metrics_port_serves_prometheus_text_while_the_replay_runs(tmp_path):
    from prometheus_client.parser import text_string_to_metric_families
    port = free_port()
    p = subprocess.Popen([REPLAY, "--trace", TRACE, "--mode", "engine", "--metrics-port",
                          str(port), *TINY], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        samples = None
        while time.monotonic() < deadline:
            try:
                status, ctype, text = scrape(port)
            except OSError:
                time.sleep(0.05)
                continue
            assert status == 200 and ctype.startswith("text/plain; version=0.0.4")
            fams = {f.name: f for f in text_string_to_metric_families(text)}
            samples = {f: [(s.labels, s.value) for s in fams[f].samples] for f in fams}
            # Mid-run: a live slot, and at least one G1 -> G2 copy has ended.
            if (sum(v for _, v in samples["kvtier_slots"]) > 0
                    and g1g2_buckets(samples) and g1g2_buckets(samples)[-1] > 0):
                break
            assert p.poll() is None, "the run ended before a live slot and a copy were seen"
            time.sleep(0.05)
        assert samples, "nothing served within 30 s"
        # prometheus_client names counters without their _total suffix.
        for fam in ("kvtier_tier_hits", "kvtier_tier_misses", "kvtier_tier_blocks",
                    "kvtier_transfers", "kvtier_transfer_bytes",
                    "kvtier_transfer_duration_seconds", "kvtier_slots",
                    "kvtier_slot_transitions", "kvtier_events_dropped"):
            assert fam in samples, fam
        assert sum(v for _, v in samples["kvtier_slots"]) > 0, "no live slot mid-run"
        assert {l["state"] for l, _ in samples["kvtier_slots"]} >= {"prefilling", "decoding"}
        counts = g1g2_buckets(samples)
        assert counts == sorted(counts) and counts[-1] > 0, "buckets are cumulative"
        assert scrape(port, "/other")[0] == 404
        assert p.poll() is None, "the run ended before the checks"
    finally:
        p.kill()
        p.wait()


def test_a_busy_metrics_port_is_a_clear_error(trace):
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        p = subprocess.run([REPLAY, "--trace", trace, "--metrics-port", str(port), *TINY],
                           capture_output=True, text=True, timeout=60)
    assert p.returncode != 0
    assert f"--metrics-port {port}: Address already in use" in p.stderr


@pytest.mark.parametrize("extra", [[], ["--offload", "lazy"], ["--g2-blocks", "0"]])
def test_a_recorded_engine_run_replays_into_a_fresh_manager_to_the_same_state(trace, tmp_path,
                                                                              extra):
    """--verify-record: the log of the run, replayed into a fresh manager, rebuilds the same
    registry in every tier, ends every slot and batch, and counts the same transitions, with
    every transition one of seed 004's and every batch ended once. Its calls, made again on a
    fresh manager and connector (kvt_event_log_rerun), end in this run's slots, registry and
    counters, each call with its recorded status, result and metadata."""
    log = tmp_path / "engine.kvtlog"
    r = replay_json("--trace", trace, "--mode", "engine", "--g1-blocks", 400, "--max-running",
                    32, "--g2-blocks", 3000, "--g3-blocks", 6000, "--g3-path", tmp_path,
                    "--record", log, "--verify-record", *TINY, *extra)
    v = r["record_replay"]
    assert v["violations"] == 0, v["first_violation"]
    assert v["same_registry"] and v["same_transitions"], v
    assert v["live_slots"] == 0 and v["open_batches"] == 0 and not v["torn"]
    assert v["finished_slots"] == 600
    assert v["registered"]["G2" if not extra or extra[0] != "--g2-blocks" else "G3"] > 0
    assert v["events"] > 10000
    rr = v["rerun"]
    assert rr["violations"] == 0, rr["first_violation"]
    assert rr["same_slots"] and rr["same_registry"] and rr["same_counters"], rr
    assert rr["calls"] > 4 * 600  # match, alloc, finished per request; a meta per step


def test_verify_record_needs_a_record():
    p = subprocess.run([REPLAY, "--trace", TRACE, "--mode", "engine", "--verify-record"],
                       capture_output=True, text=True)
    assert p.returncode != 0 and "--verify-record needs --record and --mode engine" in p.stderr
