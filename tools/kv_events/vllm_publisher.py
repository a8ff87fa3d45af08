"""A minimal publisher of vLLM's KV-event protocol for the consumer's tests, written from
vLLM's ZmqEventPublisher (vllm/distributed/kv_events.py at main 0231dd5): a PUB socket
sending [topic, seq (8 bytes big-endian), payload], and a ROUTER socket that answers a
starting seq with [topic, seq, payload] for each buffered batch from there, then
[b"", -1 as 8 signed bytes, b""]; with legacy=True, as vLLM 0.10/0.11 did, [seq, payload]
and [-1, b""]. It can leave a batch off the PUB socket (while keeping it for replay) to make
a gap. Events are maps as msgspec encodes vLLM main's tagged structs (omit_defaults: the
fields with a default are written only when set); legacy() turns one into 0.11's array."""
import threading
import time

import msgpack
import zmq

END_SEQ = (-1).to_bytes(8, "big", signed=True)


def stored(hashes, parent=None, tokens=(), block_size=16, medium="GPU", **optional):
    """A BlockStored; optional: extra_keys, group_idx, kv_cache_spec_kind, ... when set."""
    return {"type": "BlockStored", "block_hashes": list(hashes), "parent_block_hash": parent,
            "token_ids": list(tokens), "block_size": block_size, "lora_id": None,
            "medium": medium, "lora_name": None, **optional}


def removed(hashes, medium="GPU", **optional):
    return {"type": "BlockRemoved", "block_hashes": list(hashes), "medium": medium, **optional}


def cleared():
    return {"type": "AllBlocksCleared"}


def legacy(event):
    """The same event as vLLM 0.10/0.11 encoded it: a tagged array of its fields up to
    medium (lora_name and later did not exist)."""
    names = {"BlockStored": ["block_hashes", "parent_block_hash", "token_ids", "block_size",
                             "lora_id", "medium"],
             "BlockRemoved": ["block_hashes", "medium"], "AllBlocksCleared": []}[event["type"]]
    return [event["type"], *(event[n] for n in names)]


def batch(events, ts=None, rank=0):
    return msgpack.packb([time.time() if ts is None else ts, events, rank])


class Publisher:
    def __init__(self, pub_endpoint, replay_endpoint, topic=b"kv", ctx=None, legacy=False):
        self.ctx = ctx or zmq.Context.instance()
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.bind(pub_endpoint)
        self.topic = topic
        self.legacy = legacy
        self.seq = 0
        self.buffer = []
        self.lock = threading.Lock()
        self.replay_requests = 0
        self.running = True
        self.replay = self.ctx.socket(zmq.ROUTER)
        self.replay.setsockopt(zmq.LINGER, 0)
        self.replay.bind(replay_endpoint)
        self.thread = threading.Thread(target=self._serve_replay, daemon=True)
        self.thread.start()

    def send_raw(self, frames):
        self.pub.send_multipart(frames)

    def publish(self, payload, drop=False):
        """Numbers and buffers the payload; sends it unless drop. Returns its seq."""
        with self.lock:
            seq = self.seq
            self.seq += 1
            self.buffer.append((seq, payload))
        if not drop:
            self.pub.send_multipart([self.topic, seq.to_bytes(8, "big"), payload])
        return seq

    def _serve_replay(self):
        while self.running:
            if not self.replay.poll(20):
                continue
            frames = self.replay.recv_multipart()
            if len(frames) != 3:
                continue
            client, _, start = frames
            start = int.from_bytes(start, "big")
            self.replay_requests += 1
            with self.lock:
                todo = [(s, p) for s, p in self.buffer if s >= start]
            topic = [] if self.legacy else [self.topic]
            for s, p in todo:
                self.replay.send_multipart([client, b"", *topic, s.to_bytes(8, "big"), p])
            end_topic = [] if self.legacy else [b""]
            self.replay.send_multipart([client, b"", *end_topic, END_SEQ, b""])

    def close(self):
        self.running = False
        self.thread.join()
        self.pub.close(linger=0)
        self.replay.close(linger=0)
