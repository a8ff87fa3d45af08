#!/usr/bin/python3
"""Reference consumer of KV events in vLLM's ZMQ wire format, written from vLLM's schema
(vllm/distributed/kv_events.py, examples/online_serving/kv_events_subscriber.py) and not
from kvtier's encoder. Needs only Debian's python3-zmq and python3-msgpack.

It keeps, per instance (one publisher), the index of stored blocks per medium that a
KV-aware router keeps: BlockStored adds, BlockRemoved removes, AllBlocksCleared clears. It
checks that sequence numbers have no gaps and recovers a gap (or the messages before it
joined, and at start whatever the publisher still buffers) through the publisher's replay
socket. Bad messages are counted, never fatal.

    consumer.py --sub tcp://127.0.0.1:5557 --replay tcp://127.0.0.1:5558 --until-idle 2 --json
    consumer.py --instance a=tcp://h1:5557,tcp://h1:5558 --instance b=tcp://h2:5557 ...

The wire format (docs/ROUTER.md):
  message  [topic, seq as 8 bytes big-endian, payload]
  payload  msgpack of KVEventBatch: [ts, [event...], data_parallel_rank] (msgspec array_like;
           a map {"ts": ..., "events": ..., "data_parallel_rank": ...} is read too)
  event    ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id,
            medium], ["BlockRemoved", block_hashes, medium], ["AllBlocksCleared"], or the
           same as a map tagged by "type" (vLLM after #42892).
  replay   to the ROUTER socket: the first wanted seq (8 bytes big-endian); answers
           [seq, payload] per buffered batch from there, then [-1 as 8 signed bytes, b""].
As msgspec decodes these structs, extra trailing array elements and unknown map keys are
ignored, and trailing fields with defaults may be absent; here medium and
data_parallel_rank may be absent (older vLLM), the other fields are required.
"""
import argparse
import json
import sys
import time

import msgpack
import zmq

END_SEQ = (-1).to_bytes(8, "big", signed=True)

# Required fields, in msgspec's array order after the tag, then optional ones.
SCHEMA = {
    "BlockStored": (("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id"),
                    ("medium",)),
    "BlockRemoved": (("block_hashes",), ("medium",)),
    "AllBlocksCleared": ((), ()),
}


class DecodeError(ValueError):
    pass


def _fields(obj, names, optional, where):
    """The struct's fields by name, from msgspec's array (tag first) or map layout."""
    if isinstance(obj, list):
        values = obj[1:]
        if len(values) < len(names):
            raise DecodeError(f"{where}: expected at least {len(names)} fields, got {len(values)}")
        all_names = names + optional
        return {n: (values[i] if i < len(values) else None) for i, n in enumerate(all_names)}
    missing = [n for n in names if n not in obj]
    if missing:
        raise DecodeError(f"{where}: missing required field {missing[0]!r}")
    return {n: obj.get(n) for n in names + optional}


def _hash(v, where):
    if isinstance(v, bool) or not isinstance(v, int):
        raise DecodeError(f"{where}: expected an int block hash, got {type(v).__name__}")
    return v


def _int_list(v, where):
    if not isinstance(v, list):
        raise DecodeError(f"{where}: expected a list")
    for x in v:
        if isinstance(x, bool) or not isinstance(x, int):
            raise DecodeError(f"{where}: expected ints")
    return v


def decode_event(obj, where="event"):
    """One event as a dict {"type", "block_hashes", "parent_block_hash", "token_ids",
    "block_size", "medium"} (the fields its type has)."""
    if isinstance(obj, list):
        if not obj or not isinstance(obj[0], str):
            raise DecodeError(f"{where}: an array event must start with its tag")
        tag = obj[0]
    elif isinstance(obj, dict):
        tag = obj.get("type")
        if not isinstance(tag, str):
            raise DecodeError(f"{where}: a map event needs its tag under 'type'")
    else:
        raise DecodeError(f"{where}: expected an array or a map")
    if tag not in SCHEMA:
        raise DecodeError(f"{where}: unknown tag {tag[:64]!r}")
    names, optional = SCHEMA[tag]
    f = _fields(obj, names, optional, where)
    f["type"] = tag
    if "block_hashes" in f:
        hashes = f["block_hashes"]
        if not isinstance(hashes, list):
            raise DecodeError(f"{where}.block_hashes: expected a list")
        f["block_hashes"] = [_hash(h, f"{where}.block_hashes") for h in hashes]
    if tag == "BlockStored":
        if f["parent_block_hash"] is not None:
            _hash(f["parent_block_hash"], f"{where}.parent_block_hash")
        _int_list(f["token_ids"], f"{where}.token_ids")
        if isinstance(f["block_size"], bool) or not isinstance(f["block_size"], int):
            raise DecodeError(f"{where}.block_size: expected an int")
        if f["lora_id"] is not None and not isinstance(f["lora_id"], int):
            raise DecodeError(f"{where}.lora_id: expected an int or None")
    if "medium" in f and f["medium"] is not None and not isinstance(f["medium"], str):
        raise DecodeError(f"{where}.medium: expected a str or None")
    return f


def decode_batch(payload):
    """(ts, [events], data_parallel_rank) of one payload; DecodeError if it is not one."""
    try:
        obj = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception as e:  # msgpack raises several types for bad bytes
        raise DecodeError(f"not msgpack: {e}") from None
    if isinstance(obj, dict):
        if "ts" not in obj or "events" not in obj:
            raise DecodeError("batch: a map batch needs 'ts' and 'events'")
        ts, events, rank = obj["ts"], obj["events"], obj.get("data_parallel_rank")
    elif isinstance(obj, list):
        if len(obj) < 2:
            raise DecodeError("batch: expected [ts, events, data_parallel_rank]")
        ts, events = obj[0], obj[1]
        rank = obj[2] if len(obj) > 2 else None
    else:
        raise DecodeError("batch: expected an array or a map")
    if isinstance(ts, bool) or not isinstance(ts, (int, float)):
        raise DecodeError("batch.ts: expected a float")
    if not isinstance(events, list):
        raise DecodeError("batch.events: expected a list")
    if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int)):
        raise DecodeError("batch.data_parallel_rank: expected an int or None")
    return ts, [decode_event(e, f"events[{i}]") for i, e in enumerate(events)], rank


class Instance:
    """One publisher: its sockets, its sequence, and its index {medium: set of hashes}
    (medium None for events without one)."""

    def __init__(self, name, sub, replay=None):
        self.name, self.sub_endpoint, self.replay_endpoint = name, sub, replay
        self.index = {}
        self.last_seq = None
        self.caught_up = None  # the last seq the catch-up at start applied
        self.active = time.monotonic()  # its last message or resync
        self.stats = dict(messages=0, replayed=0, duplicates=0, bad=0, lost=0, restarts=0,
                          gaps=0, events=0)
        self.errors = []  # the first few reasons for bad messages
        self.sub = self.dealer = None

    def bad(self, why):
        self.stats["bad"] += 1
        if len(self.errors) < 10:
            self.errors.append(why)

    def apply(self, seq, payload):
        self.last_seq = seq
        try:
            _, events, _ = decode_batch(payload)
        except DecodeError as e:
            self.bad(f"seq {seq}: {e}")
            return
        for e in events:
            if e["type"] == "AllBlocksCleared":
                self.index.clear()
                continue
            blocks = self.index.setdefault(e.get("medium"), set())
            if e["type"] == "BlockStored":
                blocks.update(e["block_hashes"])
            else:
                blocks.difference_update(e["block_hashes"])
        self.stats["events"] += len(events)

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
                 resync=1.0, ctx=None):
        self.ctx = ctx or zmq.Context.instance()
        self.instances = [Instance(*i) for i in instances]
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
            inst.stats["lost"] += seq - expected  # what replay could not bring back
        inst.stats["messages"] += 1
        inst.apply(seq, payload)

    def _replay(self, inst, start, end):
        """Asks for [start, end) from the replay socket and applies it."""
        if inst.dealer is None:
            return
        # A DEALER talks to vLLM's ROUTER as its REQ clients do: an empty delimiter first.
        inst.dealer.send_multipart([b"", start.to_bytes(8, "big")])
        while inst.dealer.poll(int(self.replay_timeout * 1000)):
            frames = inst.dealer.recv_multipart()
            if len(frames) != 3 or frames[0] != b"" or len(frames[1]) != 8:
                inst.bad(f"replay: a bad reply of {len(frames)} frames")
                continue
            _, seq_bytes, payload = frames
            if seq_bytes == END_SEQ and payload == b"":
                return
            seq = int.from_bytes(seq_bytes, "big")
            expected = 0 if inst.last_seq is None else inst.last_seq + 1
            if seq < expected:
                inst.stats["duplicates"] += 1
            elif seq < end:  # later ones come live too
                self.last_arrival = time.monotonic()
                inst.stats["lost"] += seq - expected  # the buffer no longer held those
                inst.stats["replayed"] += 1
                inst.apply(seq, payload)
        # No end marker in time: late replies would answer the next request, so start over.
        self._open_dealer(inst)

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
    ap.add_argument("--json", action="store_true", help="print the indexes as JSON at the end")
    a = ap.parse_args(argv)
    instances = list(a.instance)
    if a.sub:
        instances.append(("default", a.sub, a.replay))
    if not instances:
        ap.error("give --sub or --instance")
    c = Consumer(instances, topic=a.topic, rcvhwm=a.rcvhwm, resync=a.resync)
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
