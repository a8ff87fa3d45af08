"""kvtier-router: against publishers written from vLLM's schema (gaps, late join, bad
messages), then against the shipped trace split by conversation across two kvtier-replay
processes, where it must name, for every request, the instance holding the longest prefix
and each instance's overlap exactly as their registries say. Run by ctest
(kv_events_pytest) with KVTIER_ROUTER, KVTIER_REPLAY and KVTIER_LIB set."""
import itertools
import json
import subprocess
import threading
import time
from pathlib import Path

import pytest
import zmq

import vllm_publisher as vp
from support import REPLAY, ROUTER, SALT, TOKENS_PER_ID, TRACE, LibHasher, ReplayRun

pytestmark = pytest.mark.skipif(not Path(ROUTER).exists(), reason="kvtier-router not built")


def router(*instances, extra=()):
    args = [ROUTER, "--page-size", "4", *extra]
    for name, sub, replay in instances:
        args += ["--instance", f"{name}={sub}" + (f",{replay}" if replay else "")]
    return subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def ask(proc, *requests):
    """Sends request lines and reads one answer per line."""
    answers = []
    for r in requests:
        proc.stdin.write(json.dumps(r) + "\n")
        proc.stdin.flush()
        answers.append(json.loads(proc.stdout.readline()))
    return answers


def settle(proc, last_seqs, timeout=10):
    """Asks for stats until every instance has applied up to its given seq."""
    deadline = time.monotonic() + timeout
    while True:
        (stats,) = ask(proc, {"stats": True})
        if all(stats["stats"][n]["last_seq"] == s for n, s in last_seqs.items()):
            return stats["stats"]
        assert time.monotonic() < deadline, stats
        time.sleep(0.05)


def endpoints(p):
    return (p.pub.getsockopt(zmq.LAST_ENDPOINT).decode(),
            p.replay.getsockopt(zmq.LAST_ENDPOINT).decode())


def test_router_follows_vllm_publishers_through_gaps_and_bad_messages():
    """a: vLLM main (map events, replay answers with the topic); b: vLLM 0.11 (arrays,
    replay answers without it)."""
    a, b = vp.Publisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*"), \
        vp.Publisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", legacy=True)
    a.publish(vp.batch([vp.stored([1, 2])]))  # before the router subscribed: replayed
    b.publish(vp.batch([vp.legacy(vp.stored([1, 2, 3, 4, 5], medium="DISK"))]))  # the same
    proc = router(("a", *endpoints(a)), ("b", *endpoints(b)))
    try:
        time.sleep(0.3)
        a.publish(vp.batch([vp.stored([3], parent=2, medium="CPU")]), drop=True)  # a gap
        a.publish(vp.batch([vp.stored([4], parent=3, group_idx=0)]))
        b.publish(b"\xc1")                                          # not msgpack
        b.publish(vp.batch([vp.legacy(vp.removed([3], medium="DISK"))]))
        stats = settle(proc, {"a": 2, "b": 2})
        (best,) = ask(proc, {"hashes": [1, 2, 3, 4, 5], "id": 7})
        assert best["id"] == 7 and best["blocks"] == 5
        assert best["overlap"] == {"a": 4, "b": 2} and best["best"] == "a"
        assert best["overlap_by_medium"]["a"] == {"GPU": 2, "CPU": 0, "DISK": 0}
        sa, sb = stats["a"], stats["b"]
        assert sa["replayed"] in (2, 3) and sa["lost"] == 0  # 3: a slow start caught up later
        assert sb["bad"] == 1 and "seq 1" in sb["last_error"] and sb["blocks"] == 4
        assert sb["replayed"] >= 1 and sb["lost"] == 0  # its first message, through replay
        # A publisher that clears its cache.
        a.publish(vp.batch([vp.cleared()]))
        settle(proc, {"a": 3})
        (after,) = ask(proc, {"hashes": [1, 2, 3, 4, 5]})
        assert after["overlap"] == {"a": 0, "b": 2} and after["best"] == "b"
        (bad,) = ask(proc, {"tokens": [1, -2]})
        assert "error" in bad
    finally:
        proc.stdin.close()
        assert proc.wait(timeout=10) == 0, proc.stderr.read()
        a.close()
        b.close()


def test_router_refuses_bad_arguments():
    for args in (["--page-size", "4", "--instance", "noequals"],
                 ["--page-size", "0", "--instance", "a=tcp://127.0.0.1:1"],
                 ["--page-size", "4", "--instance", "a=nonsense://x"]):
        p = subprocess.run([ROUTER, *args], capture_output=True, text=True, timeout=10)
        assert p.returncode != 0 and p.stderr


def trace_requests(n):
    with open(TRACE) as f:
        return [json.loads(line)["hash_ids"] for _, line in zip(range(n), f)]


def tokens_of(ids):
    return list(itertools.chain.from_iterable(
        range(h * TOKENS_PER_ID, (h + 1) * TOKENS_PER_ID) for h in ids))


@pytest.mark.skipif(not Path(REPLAY).exists(), reason="kvtier-replay not built")
def test_router_on_a_trace_split_across_two_replays(tmp_path):
    """The shipped trace's first requests, conversations split in two: instance 'even'
    replays shard 0/2 and 'odd' shard 1/2, with G1 and G2 small enough to evict."""
    n_requests, page = 300, 256
    trace = tmp_path / "head.jsonl"
    with open(TRACE) as f, open(trace, "w") as out:
        out.writelines(line for _, line in zip(range(n_requests), f))
    tiers = ["--page-size", page, "--g1-blocks", 1500, "--g2-blocks", 1500, "--g3-blocks", 0]
    even, odd = ReplayRun(tmp_path, "even"), ReplayRun(tmp_path, "odd")
    proc = subprocess.Popen([ROUTER, "--page-size", str(page), "--salt", SALT.decode(),
                             "--wait-idle-ms", "500", "--resync-ms", "300",
                             "--instance", f"even={even.sub},{even.replay}",
                             "--instance", f"odd={odd.sub},{odd.replay}"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    # hold: the replay sockets outlive the run long enough for a resync on a loaded machine
    even.start("--shard", "0/2", *tiers, trace=trace, hold=3)
    odd.start("--shard", "1/2", *tiers, trace=trace, hold=3)
    held, registry = {}, {}
    for name, run in (("even", even), ("odd", odd)):
        run.finish()
        registry[name] = run.registry()
        held[name] = registry[name]["G1"] | registry[name]["G2"]

    tokens = [tokens_of(ids) for ids in trace_requests(n_requests)]
    lines = "".join(json.dumps({"tokens": t, "id": i}) + "\n"
                    for i, t in enumerate(tokens))
    lines += json.dumps({"stats": True}) + "\n" + json.dumps({"index": True}) + "\n"
    out, err = proc.communicate(lines, timeout=120)
    assert proc.returncode == 0, err
    answers = [json.loads(line) for line in out.splitlines()]
    index = answers.pop()["index"]
    stats = answers.pop()["stats"]
    for name in ("even", "odd"):
        s = stats[name]
        assert s["bad"] == 0 and s["lost"] == 0, s
        for tier, medium in (("G1", "GPU"), ("G2", "CPU")):
            got = set(index[name].get(medium, []))
            want = registry[name][tier]
            assert got == want, (name, tier, len(got), len(want), len(got - want),
                                 len(want - got), s)

    hasher = LibHasher(SALT, page)
    only = {"even": 0, "odd": 0}
    for i, (t, got) in enumerate(zip(tokens, answers)):
        assert got["id"] == i
        h = hasher.hashes(t)
        want = {}
        for name in ("even", "odd"):
            k = 0
            while k < len(h) and h[k] in held[name]:
                k += 1
            want[name] = k
        assert got["blocks"] == len(h)
        assert got["overlap"] == want, f"request {i}"
        top = max(want.values())
        assert got["best"] == (None if top == 0 else
                               ("even" if want["even"] == top else "odd"))
        # Beyond the first id (the system prompt every conversation shares), a prefix only
        # one instance computed: the router must send the request there.
        first = TOKENS_PER_ID // page
        for name, other in (("even", "odd"), ("odd", "even")):
            if want[name] > first and want[other] <= first:
                only[name] += 1
                assert got["best"] == name
    assert only["even"] > 20 and only["odd"] > 20, only


class DroppingProxy:
    """Between a publisher and the router: forwards its messages, dropping every `every`th,
    as a network or a full queue loses them."""

    def __init__(self, upstream, every):
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.connect(upstream)
        self.pub = self.ctx.socket(zmq.PUB)
        self.port = self.pub.bind_to_random_port("tcp://127.0.0.1")
        self.endpoint = f"tcp://127.0.0.1:{self.port}"
        self.every, self.forwarded, self.dropped = every, 0, 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run)
        self.thread.start()

    def run(self):
        n = 0
        while not self.stop.is_set():
            if not self.sub.poll(50):
                continue
            msg = self.sub.recv_multipart()
            n += 1
            if n % self.every == 0:
                self.dropped += 1
            else:
                self.pub.send_multipart(msg)
                self.forwarded += 1

    def close(self):
        self.stop.set()
        self.thread.join()
        self.sub.close(0)
        self.pub.close(0)
        self.ctx.term()


def wait_for(path, proc, timeout=120):
    deadline = time.monotonic() + timeout
    while not Path(path).exists():
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, f"{path} never written"
        time.sleep(0.05)


@pytest.mark.skipif(not Path(REPLAY).exists(), reason="kvtier-replay not built")
def test_router_index_equals_the_registries_after_a_restart_and_lost_messages(tmp_path):
    """Two kvtier-replay instances. 'b' reaches the router through a proxy that drops every
    5th message, and keeps 2 batches for replay: the gaps replay cannot fill are filled by
    snapshots. 'a' keeps G3 on disk; it is killed (SIGKILL) once its run is done, and starts
    again on the same ports and G3 file with other requests: the router must forget what the
    first 'a' held and take what the second recovered and then did. At the end the router's
    index equals each instance's registry, tier by tier."""
    page = 256
    with open(TRACE) as f:
        lines = [line for _, line in zip(range(450), f)]
    first, second = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    first.write_text("".join(lines[:300]))
    second.write_text("".join(lines[300:]))
    tiers = ["--page-size", page, "--g1-blocks", 600, "--g2-blocks", 600, "--g3-blocks", 3000]
    a, b = ReplayRun(tmp_path, "a"), ReplayRun(tmp_path, "b")
    g3 = tmp_path / "a-g3"
    g3.mkdir()
    a_args = ["--shard", "0/2", *tiers, "--g3-path", g3, "--g3-keep"]
    proxy = DroppingProxy(b.sub, every=5)
    proc = subprocess.Popen([ROUTER, "--page-size", str(page), "--salt", SALT.decode(),
                             "--resync-ms", "300",
                             "--instance", f"a={a.sub},{a.replay}",
                             "--instance", f"b={proxy.endpoint},{b.replay}"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    runs = []
    try:
        runs.append(b.start("--shard", "1/2", *tiers, "--kv-events-buffer", 2,
                            trace=first, hold=600))
        runs.append(a.start(*a_args, trace=first, hold=600))
        wait_for(a.dump, a.proc)
        first_a = a.registry()
        a.proc.kill()  # SIGKILL: no goodbye, G3's file as a crash leaves it
        a.proc.wait()
        Path(a.dump).unlink()
        runs.append(a.start(*a_args, trace=second, hold=600))
        wait_for(a.dump, a.proc)
        wait_for(b.dump, b.proc)
        registry = {"a": a.registry(), "b": b.registry()}
        assert registry["a"]["G3"] & first_a["G3"], "the second 'a' recovered nothing"
        media = {"G1": "GPU", "G2": "CPU", "G3": "FS"}
        deadline = time.monotonic() + 60
        while True:
            index, stats = ask(proc, {"index": True}, {"stats": True})
            diff = {(name, tier): (len(set(index["index"][name].get(m, [])) - want),
                                   len(want - set(index["index"][name].get(m, []))))
                    for name in ("a", "b") for tier, m in media.items()
                    for want in [registry[name][tier]]}
            if all(d == (0, 0) for d in diff.values()):
                break
            assert time.monotonic() < deadline, (diff, stats)
            time.sleep(0.2)
        sa, sb = stats["stats"]["a"], stats["stats"]["b"]
        assert proxy.dropped > 0 and sb["lost"] > 0, (proxy.dropped, sb)
        assert sb["snapshots"] >= 1 and sa["snapshots"] >= 2, (sa, sb)  # a: one per start
        assert sa["bad"] == 0 and sb["bad"] == 0, (sa, sb)
    finally:
        for r in runs:
            if r.proc.poll() is None:
                r.proc.kill()
                r.proc.wait()
        proc.stdin.close()
        proc.wait(timeout=30)
        proxy.close()
