"""A minimal publisher of vLLM's KV-event protocol for the consumer's tests, written from
vLLM's ZmqEventPublisher (vllm/distributed/kv_events.py): a PUB socket sending [topic, seq
(8 bytes big-endian), payload], and a ROUTER socket that answers a starting seq with
[seq, payload] for each buffered batch from there, then [-1 as 8 signed bytes, b""]. It can
leave a batch off the PUB socket (while keeping it for replay) to make a gap."""
import threading
import time

import msgpack
import zmq

END_SEQ = (-1).to_bytes(8, "big", signed=True)


def stored(hashes, parent=None, tokens=(), block_size=16, medium="GPU", extra=()):
    """A BlockStored as msgspec encodes the array_like tagged struct."""
    return ["BlockStored", list(hashes), parent, list(tokens), block_size, None, medium, *extra]


def removed(hashes, medium="GPU"):
    return ["BlockRemoved", list(hashes), medium]


def cleared():
    return ["AllBlocksCleared"]


def as_map(event):
    """The same event tagged as a map, as vLLM encodes it since #42892."""
    names = {"BlockStored": ["block_hashes", "parent_block_hash", "token_ids", "block_size",
                             "lora_id", "medium"],
             "BlockRemoved": ["block_hashes", "medium"], "AllBlocksCleared": []}[event[0]]
    return {"type": event[0], **dict(zip(names, event[1:]))}


def batch(events, ts=None, rank=0):
    return msgpack.packb([time.time() if ts is None else ts, events, rank])


class Publisher:
    def __init__(self, pub_endpoint, replay_endpoint, topic=b"kv", ctx=None):
        self.ctx = ctx or zmq.Context.instance()
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.bind(pub_endpoint)
        self.topic = topic
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
            for s, p in todo:
                self.replay.send_multipart([client, b"", s.to_bytes(8, "big"), p])
            self.replay.send_multipart([client, b"", END_SEQ, b""])

    def close(self):
        self.running = False
        self.thread.join()
        self.pub.close(linger=0)
        self.replay.close(linger=0)
