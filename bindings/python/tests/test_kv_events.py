"""KV events from Python: a manager publishing to a ZMQ SUB socket in vLLM's wire format
(docs/KV_EVENTS.md), its topic, rank, tiers and format, and its replay socket."""
import time

import pytest

from test_kvtier import manager, stored  # also puts the package on sys.path
import kvtier  # noqa: E402

zmq = pytest.importorskip("zmq")
msgpack = pytest.importorskip("msgpack")

END_SEQ = b"\xff" * 8


class Subscriber:
    """A SUB socket bound to a free port; the manager's PUB connects to it."""

    def __init__(self, ctx):
        self.sock = ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.SUBSCRIBE, b"")
        self.sock.bind("tcp://127.0.0.1:*")
        self.endpoint = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)

    def until(self, found, nudge=None, timeout=10):
        """The batches received until one has an event found(event) accepts; nudge() makes
        events while none arrives (a SUB misses what is sent before it is connected)."""
        deadline, batches = time.monotonic() + timeout, []
        while time.monotonic() < deadline:
            if not self.sock.poll(50):
                if nudge is not None:
                    nudge()
                continue
            topic, seq, payload = self.sock.recv_multipart()
            batches.append((topic, int.from_bytes(seq, "big"), msgpack.unpackb(payload)))
            if any(found(e) for e in batches[-1][2][1]):
                return batches
        raise AssertionError("no such event within %g s: %r" % (timeout, batches))


def test_a_subscriber_receives_stored_blocks_with_their_tokens(tmp_path):
    ctx = zmq.Context()
    sub = Subscriber(ctx)
    replay = "ipc://%s/replay" % tmp_path
    filler = iter(range(1000, 2000))
    with manager(kv_events_endpoint=sub.endpoint, kv_events_replay_endpoint=replay,
                 kv_events_topic="kv", kv_events_dp_rank=3, kv_events_buffer=2,
                 kv_events_tiers=1 << kvtier.G1, min_batch_size=1) as m:
        sub.until(lambda e: True, nudge=lambda: m.release(stored(m, [next(filler)])))

        tokens = list(range(1, 9))
        hashes = kvtier.hash_sequence(tokens, 4)
        m.note_tokens(hashes, tokens)
        chain = stored(m, hashes)
        batches = sub.until(lambda e: e.get("block_hashes") == hashes)
        topic, _, (ts, events, rank) = batches[-1]
        (e,) = [e for e in events if e.get("block_hashes") == hashes]
        assert (topic, rank, e["type"], e["token_ids"], e["block_size"], e["medium"],
                e["parent_block_hash"]) == (b"kv", 3, "BlockStored", tokens, 4, "GPU", None)
        assert ts > 0

        with m.offload(chain, kvtier.G2) as x:  # G2 is not among kv_events_tiers
            assert x.wait(10) == 2
        m.release(stored(m, [77]))
        batches = sub.until(lambda e: e.get("block_hashes") == [77])
        assert all(e.get("medium") != "CPU" for _, _, b in batches for e in b[1])
        last = batches[-1][1]

        dealer = ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.RCVTIMEO, 10000)
        dealer.connect(replay)
        dealer.send_multipart([b"", (0).to_bytes(8, "big")])
        answers = []
        while not answers or answers[-1][2] != END_SEQ:
            answers.append(dealer.recv_multipart())  # ["", topic, seq, payload]
        kept = [(f[1], int.from_bytes(f[2], "big")) for f in answers[:-1]]
        assert kept == [(b"kv", last - 1), (b"kv", last)]  # kv_events_buffer: the last two
        dealer.close(linger=0)
        m.release(chain)
    sub.sock.close(linger=0)
    ctx.term()


def test_the_old_wire_format_sends_arrays():
    ctx = zmq.Context()
    sub = Subscriber(ctx)
    filler = iter(range(1000, 2000))
    with manager(kv_events_endpoint=sub.endpoint,
                 kv_events_format=kvtier.KvEventsFormat.ARRAY_V0_11) as m:
        batches = sub.until(lambda e: e[0] == "BlockStored",
                            nudge=lambda: m.release(stored(m, [next(filler)])))
        e = next(e for e in batches[-1][2][1] if e[0] == "BlockStored")
        assert len(e) == 7 and e[-1] == "GPU"
    sub.sock.close(linger=0)
    ctx.term()
