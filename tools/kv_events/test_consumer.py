"""The reference consumer against a publisher written from vLLM's schema (vllm_publisher.py),
then against kvtier-replay: its index must equal the manager's registry, also when it joins
late or its SUB socket drops messages, and every stored block's hash must follow from its
tokens. Run by ctest (kv_events_pytest) with KVTIER_REPLAY set; the kvtier-replay tests skip
when it is not built."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import msgpack
import pytest
import zmq

import consumer
import vllm_publisher as vp
from support import LIB, REPLAY, ROOT, SALT, TRACE, LibHasher, ReplayRun

# ---- decoding, as msgspec would decode vLLM's structs


def test_decodes_every_event_in_both_formats():
    events = [vp.stored([1, 2], parent=None, tokens=[5] * 32), vp.removed([1], "CPU"),
              vp.cleared()]
    for evs in (events, [vp.legacy(e) for e in events]):
        ts, out, rank = consumer.decode_batch(vp.batch(evs, ts=3.5, rank=2))
        assert (ts, rank) == (3.5, 2)
        assert [e["type"] for e in out] == ["BlockStored", "BlockRemoved", "AllBlocksCleared"]
        assert out[0]["block_hashes"] == [1, 2] and out[0]["medium"] == "GPU"
        assert out[0]["token_ids"] == [5] * 32 and out[0]["group_idx"] is None
        assert out[1]["medium"] == "CPU"


def test_shorter_and_longer_forms():
    # vLLM before medium and data_parallel_rank existed: both absent.
    old = msgpack.packb([1.0, [["BlockStored", [7], None, [], 16, None]]])
    ts, out, rank = consumer.decode_batch(old)
    assert rank is None and out[0]["medium"] is None
    # Arrays with vLLM's later fields after medium (lora_name, extra_keys, group_idx...).
    new = vp.batch([vp.legacy(vp.stored([7])) + [None, [None], 0, "full_attention"]])
    assert consumer.decode_batch(new)[1][0]["group_idx"] == 0
    # Maps: a field with a default is there when set; bytes hashes are vLLM's too.
    got = consumer.decode_batch(vp.batch([vp.removed([b"\x07" * 32], group_idx=0,
                                                     locality="LOCAL")]))[1][0]
    assert got["group_idx"] == 0 and got["locality"] == "LOCAL"
    # A field without a default cannot be left out.
    with pytest.raises(consumer.DecodeError, match="at least 5 fields"):
        consumer.decode_batch(msgpack.packb([1.0, [["BlockStored", [7], None, []]], 0]))
    no_lora_name = vp.stored([7])
    del no_lora_name["lora_name"]
    with pytest.raises(consumer.DecodeError, match="lacks 'lora_name'"):
        consumer.decode_batch(vp.batch([no_lora_name]))


def test_maps_must_be_what_msgspec_writes():
    def refused(event, why):
        with pytest.raises(consumer.DecodeError, match=why):
            consumer.decode_batch(vp.batch([event]))

    refused(vp.stored([1], color="red"), "no field 'color'")
    refused(vp.stored([1], group_idx=None), "omit_defaults")   # a default is left out
    refused({"block_hashes": [1], "type": "BlockRemoved", "medium": "GPU"}, "'type'")
    refused({"type": "BlockRemoved", "medium": "GPU", "block_hashes": [1]}, "order")
    refused(dict(vp.stored([1]), lora_name=5), r"lora_name: 5 is not str \| None")
    refused(dict(vp.stored([1]), token_ids=["a"]), r"token_ids\[0\]: 'a' is not int")
    refused(dict(vp.stored([1]), block_size=True), "block_size")
    refused(vp.removed([1], extra_keys=[None]), "no field 'extra_keys'")
    # extra_keys is list[tuple[Any, ...] | None]: tuples arrive as msgpack arrays.
    assert consumer.decode_batch(vp.batch([vp.stored([1], extra_keys=[["mm", 1], None])]))
    with pytest.raises(consumer.DecodeError, match="omit_defaults"):
        consumer.decode_batch(msgpack.packb([1.0, [], None]))  # a trailing None rank


@pytest.mark.parametrize("payload, why", [
    (b"", "not msgpack"),
    (b"\xc1", "not msgpack"),
    (vp.batch([vp.stored([1])]) + b"\x00", "not msgpack"),  # trailing bytes
    (msgpack.packb(42), "expected an array or a map"),
    (vp.batch([["BlockMoved", [1]]]), "unknown tag 'BlockMoved'"),
    (vp.batch([{"type": "BlockMoved"}]), "unknown tag 'BlockMoved'"),
    (vp.batch([["BlockRemoved", "nope", "GPU"]]), "'nope' is not list"),
    (vp.batch([["BlockRemoved", [1.5], "GPU"]]), "1.5 is not ExternalBlockHash"),
    (vp.batch([{"block_hashes": []}]), "'type'"),
    (b"\x93\xcb" + b"\0" * 8 + b"\xdd\xff\xff\xff\xff", "not msgpack"),  # claims 2^32 events
])
def test_malformed_payloads_are_refused(payload, why):
    with pytest.raises(consumer.DecodeError, match=why):
        consumer.decode_batch(payload)


def test_hashes_are_recomputed_from_tokens():
    h = consumer.Hasher(SALT)
    tokens = list(range(8))
    chain = h.chain(None, tokens, 4)
    assert h.chain(chain[0], tokens[4:], 4) == chain[1:]
    # kvtier's own hashes, through its C ABI, when the library is built.
    if Path(LIB).exists():
        assert LibHasher(SALT, 4).hashes(tokens) == chain


# ---- against vLLM's protocol on real sockets


@pytest.fixture
def publisher():
    p = vp.Publisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*")
    yield p
    p.close()


def endpoints(p):
    return (p.pub.getsockopt(zmq.LAST_ENDPOINT).decode(),
            p.replay.getsockopt(zmq.LAST_ENDPOINT).decode())


def connected(c):
    """Gives the consumer's SUB time to connect (ZMQ's slow joiner), so that the counts
    below are exact (a message missed meanwhile would come by replay anyway), and lets it
    catch up with what the publisher buffers."""
    time.sleep(0.2)
    c.poll(0)
    return c


def test_index_follows_stored_removed_cleared(publisher):
    sub, replay = endpoints(publisher)
    c = connected(consumer.Consumer([("a", sub, replay)]))
    publisher.publish(vp.batch([vp.stored([1, 2, 3]), vp.stored([2, 3], medium="CPU")]))
    publisher.publish(vp.batch([vp.removed([2])]))
    c.run(until_idle=0.3, deadline=5)
    inst = c.instances[0]
    assert inst.index == {"GPU": {1, 3}, "CPU": {2, 3}}
    publisher.publish(vp.batch([vp.cleared(), vp.stored([9], medium="FS")]))
    c.run(until_idle=0.3, deadline=5)
    assert inst.index == {"FS": {9}} and inst.last_seq == 2
    assert inst.stats["bad"] == 0 and inst.stats["lost"] == 0
    c.close()


def test_a_gap_is_recovered_through_replay(publisher):
    sub, replay = endpoints(publisher)
    c = connected(consumer.Consumer([("a", sub, replay)]))
    publisher.publish(vp.batch([vp.stored([1])]))
    publisher.publish(vp.batch([vp.stored([2])]), drop=True)  # never reaches the SUB
    publisher.publish(vp.batch([vp.stored([3])]))
    c.run(until_idle=0.3, deadline=5)
    inst = c.instances[0]
    assert inst.index == {"GPU": {1, 2, 3}}
    assert inst.stats["gaps"] >= 1 and inst.stats["replayed"] >= 1 and inst.stats["lost"] == 0
    assert inst.last_seq == 2
    c.close()


def test_a_vllm_0_11_publisher_arrays_and_replay_without_topic():
    p = vp.Publisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", legacy=True)
    sub, replay = endpoints(p)
    c = connected(consumer.Consumer([("a", sub, replay)]))
    p.publish(vp.batch([vp.legacy(vp.stored([1], medium="DISK"))]))
    p.publish(vp.batch([vp.legacy(vp.stored([2]))]), drop=True)
    p.publish(vp.batch([vp.legacy(vp.removed([1], medium="DISK"))]))
    c.run(until_idle=0.3, deadline=5)
    inst = c.instances[0]
    assert inst.index == {"DISK": set(), "GPU": {2}}
    assert inst.stats["replayed"] >= 1 and inst.stats["lost"] == 0 and inst.stats["bad"] == 0
    c.close()
    p.close()


def test_joining_late_replays_from_the_start(publisher):
    for h in range(5):
        publisher.publish(vp.batch([vp.stored([h])]))  # nobody subscribed yet
    sub, replay = endpoints(publisher)
    c = connected(consumer.Consumer([("a", sub, replay)]))
    publisher.publish(vp.batch([vp.stored([5])]))
    c.run(until_idle=0.3, deadline=5)
    inst = c.instances[0]
    assert inst.index == {"GPU": set(range(6))}
    assert inst.stats["replayed"] == 5 and inst.stats["messages"] == 1
    c.close()


def test_joining_late_without_catch_up_the_first_message_shows_the_gap(publisher):
    for h in range(3):
        publisher.publish(vp.batch([vp.stored([h])]))
    sub, replay = endpoints(publisher)
    c = connected(consumer.Consumer([("a", sub, replay)], catch_up=False))
    publisher.publish(vp.batch([vp.stored([3])]))
    c.run(until_idle=0.3, deadline=5)
    inst = c.instances[0]
    assert inst.index == {"GPU": {0, 1, 2, 3}}
    assert inst.stats["gaps"] == 1 and inst.stats["replayed"] == 3
    assert inst.stats["messages"] == 1 and inst.stats["lost"] == 0
    c.close()


def test_without_replay_a_gap_is_counted_lost(publisher):
    sub, _ = endpoints(publisher)
    c = connected(consumer.Consumer([("a", sub, None)]))
    publisher.publish(vp.batch([vp.stored([1])]))
    publisher.publish(vp.batch([vp.stored([2])]), drop=True)
    publisher.publish(vp.batch([vp.stored([3])]))
    c.run(until_idle=0.3, deadline=5)
    inst = c.instances[0]
    assert inst.index == {"GPU": {1, 3}} and inst.stats["lost"] == 1
    c.close()


def test_bad_messages_are_counted_never_fatal(publisher):
    sub, replay = endpoints(publisher)
    c = connected(consumer.Consumer([("a", sub, replay)]))
    publisher.publish(vp.batch([vp.stored([1])]))
    publisher.send_raw([b"kv", (1).to_bytes(8, "big")])                  # 2 frames
    publisher.send_raw([b"kv", b"\x01" * 7, vp.batch([])])               # a 7-byte seq
    publisher.publish(b"\xc1\xc1")                                       # not msgpack
    publisher.publish(vp.batch([["BlockMoved", [1]]]))                   # unknown tag
    publisher.publish(vp.batch([vp.stored([2])]))
    c.run(until_idle=0.3, deadline=5)
    inst = c.instances[0]
    assert inst.stats["bad"] == 4, inst.errors
    assert inst.index == {"GPU": {1, 2}} and inst.last_seq == 3
    assert any("unknown tag" in e for e in inst.errors)
    c.close()


def test_a_restarted_publisher_starts_a_new_index(publisher):
    sub, replay = endpoints(publisher)
    c = connected(consumer.Consumer([("a", sub, replay)]))
    publisher.publish(vp.batch([vp.stored([1])]))
    publisher.publish(vp.batch([vp.stored([2])]))
    c.run(until_idle=0.3, deadline=5)
    publisher.send_raw([b"kv", (0).to_bytes(8, "big"), vp.batch([vp.stored([7])])])
    c.run(until_idle=0.3, deadline=5)
    inst = c.instances[0]
    assert inst.stats["restarts"] == 1 and inst.index == {"GPU": {7}}
    c.close()


# ---- against kvtier-replay

needs_replay = pytest.mark.skipif(not Path(REPLAY).exists(), reason="kvtier-replay not built")

MEDIUM_OF_TIER = {"G1": "GPU", "G2": "CPU", "G3": "FS"}
# Small tiers, so that blocks are evicted from each and the removals matter.
TIERS = ("--g1-blocks", 300, "--g2-blocks", 600, "--g3-blocks", 900)


def follow(run, *consumers):
    """Polls until the replay process has exited (it holds its sockets open a while after
    its last event), then until the stream is idle."""
    deadline = time.monotonic() + 120
    while run.proc.poll() is None and time.monotonic() < deadline:
        for c in consumers:
            c.poll(20)
    for c in consumers:
        c.run(until_idle=0.3, deadline=10)


def index_by_tier(inst):
    return {t: inst.index.get(m, set()) for t, m in MEDIUM_OF_TIER.items()}


def assert_every_hash_from_its_tokens(inst):
    s = inst.stats
    assert s["hashes_checked"] > 0, (s, inst.errors)
    assert s["no_tokens"] == 0 and s["hash_mismatches"] == 0, (s, inst.errors)


@needs_replay
def test_index_equals_the_registry(tmp_path):
    run = ReplayRun(tmp_path)
    c = consumer.Consumer([("kvtier", run.sub, run.replay)], resync=0.3, salt=SALT)
    run.start(*TIERS, hold=5)
    follow(run, c)
    report = run.finish()
    inst = c.instances[0]
    want = run.registry()
    assert all(want[t] for t in want), "every tier should hold blocks at the end"
    assert report["requests"] == 300
    assert inst.stats["bad"] == 0, inst.errors
    assert inst.stats["lost"] == 0
    assert set(inst.index) <= set(MEDIUM_OF_TIER.values())
    assert index_by_tier(inst) == want
    assert_every_hash_from_its_tokens(inst)
    c.close()


@needs_replay
def test_a_late_consumer_with_a_tiny_queue_recovers_through_replay(tmp_path):
    """One consumer follows from the start; a second joins after a while (the replay may be
    over by then: it publishes faster than Python reads), with a receive queue of one
    message, and reads slowly. What it missed comes through the replay socket, and it must
    end with the same index. (A gap seen in the live stream is recovered the same way: the
    tests with vllm_publisher.py make one on purpose.)"""
    run = ReplayRun(tmp_path)
    first = consumer.Consumer([("kvtier", run.sub, run.replay)], resync=0.3, salt=SALT)
    run.start(*TIERS, hold=5)
    while first.instances[0].last_seq is None or first.instances[0].last_seq < 20:
        first.poll(100)
        assert run.proc.poll() is None, "the replay ended before the second consumer joined"
    late = consumer.Consumer([("kvtier", run.sub, run.replay)], rcvhwm=1, resync=0.3,
                             salt=SALT)
    deadline = time.monotonic() + 120
    while not run.dump.exists() and time.monotonic() < deadline:
        first.poll(20)
        late.poll(0)
        time.sleep(0.05)  # a slow reader
    # The replay is over and holds its sockets open: both catch up.
    follow(run, first, late)
    run.finish()
    want = run.registry()
    a, b = first.instances[0], late.instances[0]
    assert index_by_tier(a) == want
    assert b.stats["replayed"] > 20
    assert b.stats["lost"] == 0 and b.stats["bad"] == 0, b.errors
    assert index_by_tier(b) == want
    assert_every_hash_from_its_tokens(a)
    assert_every_hash_from_its_tokens(b)  # what it got through replay, too
    first.close()
    late.close()


@needs_replay
def test_cli_prints_the_index_as_json(tmp_path):
    run = ReplayRun(tmp_path).start("--g1-blocks", 300, "--g2-blocks", 0, "--g3-blocks", 0,
                                    hold=5)
    # Joins once the replay has begun: what it missed comes through the replay socket.
    cli = subprocess.run(["/usr/bin/python3", str(Path(consumer.__file__)), "--sub", run.sub,
                          "--replay", run.replay, "--until-idle", "1.5", "--timeout", "60",
                          "--json"], capture_output=True, text=True, timeout=90)
    run.finish()
    assert cli.returncode == 0, cli.stderr
    got = json.loads(cli.stdout)["instances"]["default"]
    assert set(got["index"]["GPU"]) == run.registry()["G1"]
    assert got["stats"]["bad"] == 0 and got["stats"]["lost"] == 0


@needs_replay
def test_every_stored_block_carries_the_tokens_of_its_hash(tmp_path):
    """The shipped trace at 256 tokens a block, G1 and G2 of 1,500 blocks: each request
    evicts hundreds of blocks after noting its own, the publisher's thread encodes while
    thousands more are noted, and offloads copy blocks noted long before. Every BlockStored
    has the tokens its hashes follow from: for a consumer that follows the run (live, gaps
    replayed) and for one that joins after it (all of it replayed)."""
    trace = tmp_path / "head.jsonl"
    with open(TRACE) as f, open(trace, "w") as out:
        out.writelines(line for _, line in zip(range(800), f))
    run = ReplayRun(tmp_path)
    follower = consumer.Consumer([("kvtier", run.sub, run.replay)], salt=SALT, resync=0.3)
    # hold: the late consumer joins once the run is over; on a loaded 2-core machine Python
    # may take seconds to connect and replay all of it.
    run.start("--page-size", 256, "--g1-blocks", 1500, "--g2-blocks", 1500, "--g3-blocks", 0,
              trace=trace, hold=15)
    deadline = time.monotonic() + 120
    while not run.dump.exists() and time.monotonic() < deadline:
        follower.poll(20)
    # The replay is over and holds its sockets open: one more consumer catches up.
    late = consumer.Consumer([("kvtier", run.sub, run.replay)], salt=SALT, resync=0.3)
    follow(run, follower, late)
    run.finish()
    a, b = follower.instances[0], late.instances[0]
    for inst in (a, b):
        assert inst.stats["bad"] == 0 and inst.stats["lost"] == 0, inst.errors
        assert_every_hash_from_its_tokens(inst)
    # (Their indexes may differ by what the manager's destroy sent last: a consumer still
    # behind then has no replay socket left to ask.)
    assert b.stats["replayed"] > 0
    follower.close()
    late.close()


def test_the_library_in_the_old_format(tmp_path):
    """A manager of the Python binding with kv_events_format=1 (a config field it passes by
    name) publishes vLLM 0.11's arrays and answers replay without the topic frame."""
    if not Path(LIB).exists():
        pytest.skip(f"libkvtier not built: {LIB}")
    os.environ.setdefault("KVTIER_LIB_DIR", str(Path(LIB).parent))
    sys.path.insert(0, str(ROOT / "bindings" / "python"))
    try:
        import kvtier
        from kvtier._ffi import C, ffi
    finally:
        sys.path.pop(0)
    pub, rep = f"ipc://{tmp_path}/pub", f"ipc://{tmp_path}/replay"
    c_pub, c_rep = ffi.new("char[]", pub.encode()), ffi.new("char[]", rep.encode())
    with pytest.raises(kvtier.InvalidArgumentError, match="kv_events_format"):
        kvtier.Manager(page_size=4, chunk_bytes=0, kv_events_endpoint=c_pub,
                       kv_events_format=2)
    m = kvtier.Manager(page_size=4, chunk_bytes=0, g1_blocks=8, g2_blocks=0,
                       kv_events_endpoint=c_pub, kv_events_replay_endpoint=c_rep,
                       kv_events_format=C.KVT_KV_EVENTS_FORMAT_ARRAY_V0_11)
    try:
        tokens = list(range(100, 108))
        hashes = LibHasher(SALT, 4).hashes(tokens)
        assert C.kvt_manager_note_tokens(m._live(), ffi.new("uint64_t[]", hashes), 2,
                                         ffi.new("uint32_t[]", tokens)) == 0
        m.register_hashes(m.alloc(2), hashes)
        c = consumer.Consumer([("kvtier", pub, rep)], salt=SALT, resync=0.1)
        deadline = time.monotonic() + 30
        while not c.instances[0].index and time.monotonic() < deadline:
            c.poll(50)  # the stored blocks come through replay (resync) if not live
        inst = c.instances[0]
        assert inst.index == {"GPU": set(hashes)}, inst.errors
        assert_every_hash_from_its_tokens(inst)
        dealer = zmq.Context.instance().socket(zmq.DEALER)
        dealer.connect(rep)
        dealer.send_multipart([b"", (0).to_bytes(8, "big")])
        events = []
        while True:  # [b"", seq, payload] per batch, then [b"", -1, b""]
            assert dealer.poll(10000)
            reply = dealer.recv_multipart()
            assert len(reply) == 3
            if reply[1] == (2**64 - 1).to_bytes(8, "big"):
                break
            events += msgpack.unpackb(reply[2])[1]
        # Array events: the start's announcement first, then the stored blocks.
        assert events[0] == ["AllBlocksCleared"]
        assert [e[0] for e in events[1:]] == ["BlockStored"], events
        dealer.close(linger=0)
        c.close()
    finally:
        m.close()


@needs_replay
def test_a_consumer_the_replay_buffer_cannot_cover_takes_a_snapshot(tmp_path):
    """kvtier-replay keeps 2 batches for replay; a consumer joins once the run is over (its
    catch-up replay no longer begins at 0) and another follows from the start with a
    receive queue of one message, so that gaps appear that replay cannot fill. Both ask for
    a snapshot, and end with the index equal to the manager's registry."""
    run = ReplayRun(tmp_path)
    follower = consumer.Consumer([("kvtier", run.sub, run.replay)], rcvhwm=1, resync=0.3,
                                 salt=SALT)
    run.start(*TIERS, "--kv-events-buffer", 2, hold=5)
    deadline = time.monotonic() + 120
    while not run.dump.exists() and time.monotonic() < deadline:
        follower.poll(0)
        time.sleep(0.02)  # a slow reader: its one-message queue overflows
    late = consumer.Consumer([("kvtier", run.sub, run.replay)], resync=0.3, salt=SALT)
    follow(run, follower, late)
    run.finish()
    want = run.registry()
    for inst in (follower.instances[0], late.instances[0]):
        s = inst.stats
        assert s["snapshots"] >= 1 and s["bad"] == 0, (s, inst.errors)
        assert not inst.stale
        assert s["hash_mismatches"] == 0, inst.errors  # the blocks that came with tokens
        assert index_by_tier(inst) == want, s
    assert follower.instances[0].stats["lost"] > 0
    follower.close()
    late.close()
