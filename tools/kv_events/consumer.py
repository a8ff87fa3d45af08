#!/usr/bin/python3
"""Reference consumer of KV events in vLLM's ZMQ wire format, written from vLLM's schema
(vllm/distributed/kv_events.py, examples/features/kv_events/kv_events_subscriber.py) and not
from kvtier's encoder. Needs only Debian's python3-zmq and python3-msgpack (and
python3-xxhash to check block hashes).

It keeps, per instance (one publisher), the index of stored blocks per medium that a
KV-aware router keeps: BlockStored adds, BlockRemoved removes, AllBlocksCleared clears. It
checks that sequence numbers have no gaps and recovers a gap (or the messages before it
joined, and at start whatever the publisher still buffers) through the publisher's replay
socket, and what replay no longer holds through a kvtier publisher's snapshot. Bad
messages are counted, never fatal. With --salt it recomputes every stored block's hash from
its token_ids (kvtier's hashing) and counts mismatches and blocks without tokens.

    consumer.py --sub tcp://127.0.0.1:5557 --replay tcp://127.0.0.1:5558 --until-idle 2 --json
    consumer.py --instance a=tcp://h1:5557,tcp://h1:5558 --instance b=tcp://h2:5557 ...

The wire format (docs/KV_EVENTS.md, docs/ROUTER.md):
  message  [topic, seq as 8 bytes big-endian, payload]
  payload  msgpack of KVEventBatch: [ts, [event...], data_parallel_rank] (msgspec array_like,
           data_parallel_rank left out when None; a map {"ts", "events", ...} is read too)
  event    vLLM main: a map tagged by "type", {"type": "BlockStored", "block_hashes": ...},
           each checked against vLLM's struct definitions (vllm_schema.py: from $VLLM_SRC's
           kv_events.py when set, else a built-in copy): the fields without a default all
           there, those with one only when not equal to it, in declaration order, no other
           key, each of its annotated type. vLLM 0.10/0.11: a tagged array
           ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id,
           medium], ["BlockRemoved", block_hashes, medium], ["AllBlocksCleared"], extra
           trailing elements ignored and medium optional, as msgspec read them.
  replay   to the ROUTER socket: the first wanted seq (8 bytes big-endian); answers
           [topic, seq, payload] per buffered batch from there, then [b"", -1 as 8 signed
           bytes, b""] (vLLM 0.10/0.11: [seq, payload], then [-1, b""]).
  snapshot kvtier's: b"KVTIER_SNAPSHOT" instead of the seq; answers batches of every block
           held (AllBlocksCleared first), all numbered with the seq of the next live batch,
           then END_SEQ.
"""
import argparse
import array
import json
import struct
import sys
import time

import msgpack
import zmq

from vllm_schema import Schema, SchemaError

END_SEQ = (-1).to_bytes(8, "big", signed=True)
SNAPSHOT_REQUEST = b"KVTIER_SNAPSHOT"  # kvtier's addition (docs/KV_EVENTS.md, Snapshots)
SCHEMA = Schema.load()


class DecodeError(ValueError):
    pass


def decode_event(obj, where="event", schema=SCHEMA):
    """One event as a dict {"type", every field of its struct} (absent ones at their
    defaults)."""
    try:
        if isinstance(obj, list):
            return schema.check_event_array(obj, where)
        if isinstance(obj, dict):
            return schema.check_event_map(obj, where)
    except SchemaError as e:
        raise DecodeError(str(e)) from None
    raise DecodeError(f"{where}: expected an array or a map")


def decode_batch(payload, schema=SCHEMA):
    """(ts, [events], data_parallel_rank) of one payload; DecodeError if it is not one."""
    try:
        obj = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception as e:  # msgpack raises several types for bad bytes
        raise DecodeError(f"not msgpack: {e}") from None
    try:
        ts, events, rank = schema.check_batch(obj)
    except SchemaError as e:
        raise DecodeError(str(e)) from None
    return ts, [decode_event(e, f"events[{i}]", schema) for i, e in enumerate(events)], rank


class Hasher:
    """kvtier's sequence hashes (include/kvtier.h, Hashing): chained xxh3-64 seeded with the
    salt's hash, over each block's tokens as little-endian u32."""

    def __init__(self, salt):
        import xxhash  # python3-xxhash, only to check hashes
        self._xxh = xxhash.xxh3_64_intdigest
        self.salt_hash = self._xxh(salt, seed=0)

    def chain(self, parent, token_ids, block_size):
        """The sequence hashes of consecutive full blocks after parent (None: the first)."""
        data = array.array("I", token_ids)
        if sys.byteorder == "big":
            data.byteswap()
        raw, step, out = data.tobytes(), 4 * block_size, []
        for at in range(0, len(raw), step):
            h = self._xxh(raw[at:at + step], seed=self.salt_hash)
            if parent is not None:
                h = self._xxh(struct.pack("<QQ", parent, h), seed=self.salt_hash)
            out.append(h)
            parent = h
        return out


class Instance:
    """One publisher: its sockets, its sequence, and its index {medium: set of hashes}
    (medium None for events without one)."""

    def __init__(self, name, sub, replay=None, hasher=None):
        self.name, self.sub_endpoint, self.replay_endpoint = name, sub, replay
        self.hasher = hasher
        self.index = {}
        self.last_seq = None
        self.caught_up = None  # the last seq the catch-up at start applied
        self.active = time.monotonic()  # its last message or resync
        self.stats = dict(messages=0, replayed=0, duplicates=0, bad=0, lost=0, restarts=0,
                          gaps=0, events=0, snapshots=0)
        self.stale = False  # the index may lack what lost messages said
        if hasher:  # stored blocks whose hash matched their tokens, did not, had no tokens
            self.stats.update(hashes_checked=0, hash_mismatches=0, no_tokens=0)
        self.errors = []  # the first few reasons for bad messages and mismatches
        self.sub = self.dealer = None

    def bad(self, why):
        self.stats["bad"] += 1
        if len(self.errors) < 10:
            self.errors.append(why)

    def apply(self, seq, payload, snapshot=False):
        """Applies one batch (one that does not decode is counted bad). A snapshot's batch
        leaves the sequence alone, and its blocks carry no tokens to check."""
        if not snapshot:
            self.last_seq = seq
        try:
            _, events, _ = decode_batch(payload)
        except DecodeError as e:
            self.bad(f"seq {seq}: {e}")
            return
        for e in events:
            if self.hasher and e["type"] == "BlockStored" and not snapshot:
                self.check_hashes(seq, e)
            if e["type"] == "AllBlocksCleared":
                self.index.clear()
                continue
            blocks = self.index.setdefault(e.get("medium"), set())
            if e["type"] == "BlockStored":
                blocks.update(e["block_hashes"])
            else:
                blocks.difference_update(e["block_hashes"])
        self.stats["events"] += len(events)

    def check_hashes(self, seq, e):
        hashes, tokens, size = e["block_hashes"], e["token_ids"], e["block_size"]
        if not tokens:
            self.stats["no_tokens"] += len(hashes)
            if len(self.errors) < 10:
                self.errors.append(f"seq {seq}: BlockStored of {len(hashes)} block(s) in "
                                   f"{e['medium']} without token_ids")
            return
        if size <= 0 or len(tokens) != size * len(hashes):
            self.bad(f"seq {seq}: {len(tokens)} token_ids for {len(hashes)} block(s) of "
                     f"{size}")
            return
        try:
            want = self.hasher.chain(e["parent_block_hash"], tokens, size)
        except (OverflowError, struct.error):  # not u32 tokens, not a u64 parent
            self.bad(f"seq {seq}: token_ids or parent_block_hash out of kvtier's range")
            return
        self.stats["hashes_checked"] += len(hashes)
        wrong = sum(a != b for a, b in zip(hashes, want))
        self.stats["hash_mismatches"] += wrong
        if wrong and len(self.errors) < 10:
            self.errors.append(f"seq {seq}: {wrong} block hash(es) do not match their tokens")

    def as_json(self):
        return {"last_seq": self.last_seq, "stats": self.stats, "errors": self.errors,
                "index": {("" if m is None else m): sorted(h) for m, h in self.index.items() if h}}


class Consumer:
    """Subscribes to instances and keeps their indexes. poll() handles what has arrived;
    run() until the stream has been idle or a deadline passed. An instance quiet for resync
    seconds (None: never) is asked for what follows its last message. With catch_up, the first
    poll asks every replay socket for what it buffers; without, an instance that ran before
    is only noticed at its next message, whose seq shows the gap (as vLLM's example does)."""

    def __init__(self, instances, topic="", rcvhwm=None, replay_timeout=1.0, catch_up=True,
                 resync=1.0, ctx=None, salt=None):
        """salt (bytes): recompute every stored block's hash from its tokens."""
        self.ctx = ctx or zmq.Context.instance()
        hasher = None if salt is None else Hasher(salt)
        self.instances = [Instance(*i, hasher=hasher) for i in instances]
        self.replay_timeout = replay_timeout
        self.resync = resync
        self.poller = zmq.Poller()
        self.last_arrival = time.monotonic()
        self.started = not catch_up
        for inst in self.instances:
            inst.sub = self.ctx.socket(zmq.SUB)
            inst.sub.setsockopt(zmq.LINGER, 0)
            if rcvhwm is not None:
                inst.sub.setsockopt(zmq.RCVHWM, rcvhwm)
            inst.sub.setsockopt(zmq.SUBSCRIBE, topic.encode())
            # vLLM's rule mirrored: a publisher that connects (no wildcard) needs a bind here.
            (inst.sub.bind if "*" in inst.sub_endpoint else inst.sub.connect)(inst.sub_endpoint)
            self.poller.register(inst.sub, zmq.POLLIN)
            self._open_dealer(inst)

    def _open_dealer(self, inst):
        if inst.dealer is not None:
            inst.dealer.close(linger=0)
            inst.dealer = None
        if inst.replay_endpoint:
            inst.dealer = self.ctx.socket(zmq.DEALER)
            inst.dealer.setsockopt(zmq.LINGER, 0)
            inst.dealer.setsockopt(zmq.RCVHWM, 0)  # a replay's replies all come at once
            inst.dealer.connect(inst.replay_endpoint)

    def close(self):
        for inst in self.instances:
            inst.sub.close(linger=0)
            if inst.dealer is not None:
                inst.dealer.close(linger=0)

    def catch_up(self):
        """Asks each instance's replay socket for everything it still buffers, so that an
        instance that ran before we joined is known before its next event. Done by the
        first poll; the live messages the catch-up already applied count as duplicates."""
        self.started = True
        for inst in self.instances:
            if inst.last_seq is None:
                self._replay(inst, 0, float("inf"))
                inst.caught_up = inst.last_seq
                if inst.stale:  # the buffer no longer began at 0
                    self._snapshot(inst)

    def poll(self, timeout_ms=100):
        """Handles the messages that arrive within timeout_ms; returns how many."""
        if not self.started:
            self.catch_up()
        n = 0
        ready = dict(self.poller.poll(timeout_ms))
        now = time.monotonic()
        for inst in self.instances:
            if inst.sub not in ready and self.resync and now - inst.active >= self.resync:
                # Quiet a while: ask for what follows the last message. Messages lost at the
                # end of a burst are otherwise never noticed, as no later one shows them
                # missing (a SUB that connected after the burst, say).
                inst.active = now
                if not (inst.stale and self._snapshot(inst)):
                    self._replay(inst, 0 if inst.last_seq is None else inst.last_seq + 1,
                                 float("inf"))
        for sock in ready:
            inst = next(i for i in self.instances if i.sub is sock)
            inst.active = now
            while True:
                try:
                    frames = sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                self.last_arrival = time.monotonic()
                self._live(inst, frames)
                n += 1
        return n

    def run(self, until_idle=2.0, deadline=None):
        """Polls until no message has come for until_idle seconds, or until deadline
        (seconds from now)."""
        end = None if deadline is None else time.monotonic() + deadline
        self.last_arrival = time.monotonic()
        while time.monotonic() - self.last_arrival < until_idle:
            if end is not None and time.monotonic() >= end:
                break
            self.poll(50)

    def _live(self, inst, frames):
        if len(frames) != 3:
            inst.bad(f"a message of {len(frames)} frames, not 3")
            return
        _, seq_bytes, payload = frames
        if len(seq_bytes) != 8:
            inst.bad(f"a sequence frame of {len(seq_bytes)} bytes, not 8")
            return
        seq = int.from_bytes(seq_bytes, "big")
        if inst.caught_up is not None:
            if seq <= inst.caught_up:
                inst.stats["duplicates"] += 1  # sent live while the catch-up replayed it
                return
            inst.caught_up = None
        if inst.last_seq is not None and seq <= inst.last_seq:
            # Live numbers only grow: the publisher started over, and its cache with it.
            inst.stats["restarts"] += 1
            inst.last_seq = None
            inst.index.clear()
        expected = 0 if inst.last_seq is None else inst.last_seq + 1
        if seq > expected:
            inst.stats["gaps"] += 1
            self._replay(inst, expected, seq)
            expected = 0 if inst.last_seq is None else inst.last_seq + 1
            if seq > expected:  # what replay could not bring back
                inst.stats["lost"] += seq - expected
                inst.stale = True
            # A snapshot also covers this message, published before it was asked for.
            if inst.stale and self._snapshot(inst):
                return
        inst.stats["messages"] += 1
        inst.apply(seq, payload)

    def _ask(self, inst, request, what, on_batch):
        """Sends a request's last frame to the replay socket and hands each reply's seq and
        payload to on_batch; True at END_SEQ, False without a replay socket or when the end
        marker did not come in time."""
        if inst.dealer is None:
            return False
        # A DEALER talks to vLLM's ROUTER as its REQ clients do: an empty delimiter first.
        inst.dealer.send_multipart([b"", request])
        while inst.dealer.poll(int(self.replay_timeout * 1000)):
            frames = inst.dealer.recv_multipart()
            # [b"", topic, seq, payload] (vLLM #45177), or [b"", seq, payload] before it.
            if len(frames) not in (3, 4) or frames[0] != b"" or len(frames[-2]) != 8:
                inst.bad(f"{what}: a bad reply of {len(frames)} frames")
                continue
            seq_bytes, payload = frames[-2:]
            if seq_bytes == END_SEQ and payload == b"":
                return True
            on_batch(int.from_bytes(seq_bytes, "big"), payload)
        # No end marker in time: late replies would answer the next request, so start over.
        self._open_dealer(inst)
        return False

    def _replay(self, inst, start, end):
        """Asks for [start, end) from the replay socket and applies it."""
        def batch(seq, payload):
            expected = 0 if inst.last_seq is None else inst.last_seq + 1
            if seq < expected:
                inst.stats["duplicates"] += 1
            elif seq < end:  # later ones come live too
                self.last_arrival = time.monotonic()
                if seq > expected:  # the buffer no longer held those
                    inst.stats["lost"] += seq - expected
                    inst.stale = True
                inst.stats["replayed"] += 1
                inst.apply(seq, payload)
        self._ask(inst, start.to_bytes(8, "big"), "replay", batch)

    def _snapshot(self, inst):
        """Asks a kvtier publisher for every block it holds, numbered with the seq of its
        next live batch, and replaces the instance's index with it; live messages before
        that number are then duplicates. False when none came (a vLLM publisher answers
        END_SEQ alone; an older kvtier one, nothing), or when it was cut short or held a
        bad message: the index is then stale."""
        nxt, bad = None, inst.stats["bad"]

        def batch(seq, payload):
            nonlocal nxt
            if nxt is not None and seq != nxt:
                inst.bad("snapshot: messages with two sequence numbers")
                return
            nxt = seq
            self.last_arrival = time.monotonic()
            inst.apply(seq, payload, snapshot=True)
        ended = self._ask(inst, SNAPSHOT_REQUEST, "snapshot", batch)
        if nxt is None:
            return False
        whole = ended and inst.stats["bad"] == bad
        if ended:
            inst.last_seq = inst.caught_up = nxt - 1 if nxt else None
        inst.stale = not whole
        inst.stats["snapshots"] += whole
        return whole

    def as_json(self):
        return {"instances": {i.name: i.as_json() for i in self.instances}}


def parse_instance(arg):
    name, sep, rest = arg.partition("=")
    if not sep or not name or not rest:
        raise argparse.ArgumentTypeError(f"expected NAME=SUB[,REPLAY], not {arg!r}")
    sub, _, replay = rest.partition(",")
    return name, sub, replay or None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sub", help="the publisher's endpoint (one instance, named 'default')")
    ap.add_argument("--replay", help="its replay endpoint")
    ap.add_argument("--instance", action="append", default=[], type=parse_instance,
                    help="NAME=SUB[,REPLAY], repeatable")
    ap.add_argument("--topic", default="", help="topic prefix to subscribe to ('': all)")
    ap.add_argument("--until-idle", type=float, default=2.0,
                    help="stop once no message has come for this many seconds (2)")
    ap.add_argument("--timeout", type=float, default=None, help="stop after this many seconds")
    ap.add_argument("--rcvhwm", type=int, default=None, help="SUB receive high-water mark")
    ap.add_argument("--resync", type=float, default=1.0,
                    help="ask a quiet instance for what follows its last message after this "
                         "many seconds; 0: never (1)")
    ap.add_argument("--salt", help="recompute every stored block's hash from its token_ids "
                                   "with kvtier's hashing and this salt (kvtier-replay's: "
                                   "kvtier-replay)")
    ap.add_argument("--json", action="store_true", help="print the indexes as JSON at the end")
    a = ap.parse_args(argv)
    print(f"consumer: checking events against {SCHEMA.source}", file=sys.stderr)
    instances = list(a.instance)
    if a.sub:
        instances.append(("default", a.sub, a.replay))
    if not instances:
        ap.error("give --sub or --instance")
    c = Consumer(instances, topic=a.topic, rcvhwm=a.rcvhwm, resync=a.resync,
                 salt=None if a.salt is None else a.salt.encode())
    try:
        c.run(until_idle=a.until_idle, deadline=a.timeout)
    except KeyboardInterrupt:
        pass
    out = c.as_json()
    c.close()
    if a.json:
        json.dump(out, sys.stdout)
        sys.stdout.write("\n")
    else:
        for name, i in out["instances"].items():
            sizes = ", ".join(f"{m or 'None'}: {len(h)}" for m, h in i["index"].items())
            print(f"{name}: last seq {i['last_seq']}, {sizes or 'no blocks'}; {i['stats']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
