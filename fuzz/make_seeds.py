#!/usr/bin/env python3
"""Writes the starting seeds of fuzz/corpus/<name>/: random programs of several lengths
from a fixed generator, so that the seeds are reproducible; for connector_meta, valid
messages of the wire format (docs/CONNECTOR.md). The fuzzers' own finds are merged in on
top (see docs/FUZZING.md)."""
import os
import random
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
rng = random.Random(20261121)
for name, lengths in (("api", [16, 64, 256, 1024, 4096]),
                      ("config", [8, 32, 256, 512]),
                      ("hash", [4, 64, 1024, 8192, 20000])):
    d = os.path.join(HERE, "corpus", name)
    os.makedirs(d, exist_ok=True)
    for i, n in enumerate(lengths * 3):
        with open(os.path.join(d, "seed-%02d" % i), "wb") as f:
            f.write(bytes(rng.randrange(256) for _ in range(n)))


def pack(v):
    """msgpack in its shortest forms, as the library's encoder writes it."""
    if isinstance(v, bool):
        return b"\xc3" if v else b"\xc2"
    if isinstance(v, int) and v >= 0:
        for limit, head, fmt in ((1 << 7, b"", "B"), (1 << 8, b"\xcc", "B"),
                                 (1 << 16, b"\xcd", ">H"), (1 << 32, b"\xce", ">I")):
            if v < limit:
                return head + struct.pack(fmt, v)
        return b"\xcf" + struct.pack(">Q", v)
    if isinstance(v, int):
        if v >= -32:
            return struct.pack("b", v)
        for limit, head, fmt in ((1 << 7, b"\xd0", "b"), (1 << 15, b"\xd1", ">h")):
            if v >= -limit:
                return head + struct.pack(fmt, v)
        return b"\xd2" + struct.pack(">i", v)
    if isinstance(v, str):
        b = v.encode()
        if len(b) < 32:
            return bytes([0xa0 | len(b)]) + b
        return (b"\xd9" + struct.pack("B", len(b)) if len(b) < 256
                else b"\xda" + struct.pack(">H", len(b))) + b
    n = len(v)
    head = bytes([0x90 | n]) if n < 16 else b"\xdc" + struct.pack(">H", n)
    return head + b"".join(pack(x) for x in v)


def batch(i, req, n_ops, tier, cap):
    return [i, req, [[i * 7 + k, tier, (i + k) % cap, rng.getrandbits(64), k] for k in range(n_ops)]]


# Format version 2: the shape ends with the world's size, and a report with its rank.
shape = [16, 50, 4096, 2]
d = os.path.join(HERE, "corpus", "connector_meta")
os.makedirs(d, exist_ok=True)
seeds = {
    "meta-empty": ["kvtier-meta", 2, [0, 0, 0, 1], 0, False, [], [], [], []],
    "meta-step": ["kvtier-meta", 2, shape, 3, True, [batch(1, "lazy", 1, 2, 50)],
                  [batch(2, "req-A", 2, 2, 50), batch(3, "req-B", 3, 3, 4096)],
                  [batch(4, "x" * 40, 20, 3, 4096)], ["req-C", "f" * 255]],
    "report-empty": ["kvtier-report", 2, [0, 0, 0, 1], [], [], [], [], 0],
    "report-step": ["kvtier-report", 2, shape, [[2, []], [3, [[1, -8], [2, -7]]]],
                    [[4, [[0, -2147483648]]]], ["req-A"], ["req-B", "r" * 32], 1],
}
for name, msg in seeds.items():
    with open(os.path.join(d, name), "wb") as f:
        f.write(pack(msg))

# kv_events: KV-event payloads in vLLM's msgspec layouts (docs/ROUTER.md), array and map.
import msgpack  # noqa: E402  (python3-msgpack)

stored = ["BlockStored", [11, 12, 2**64 - 1], 10, list(range(32)), 16, None, "GPU"]
kv_seeds = {
    "array-every-event": [1.5, [stored, ["BlockRemoved", [11], "CPU"], ["AllBlocksCleared"]], 0],
    "array-old-short": [2.0, [stored[:6], ["BlockRemoved", [-5]]]],
    "array-new-long": [3.0, [stored + [None, [None, None, None], 0, "full_attention"]], None],
    "map-events": [4.0, [{"type": "BlockStored", "block_hashes": [1], "parent_block_hash": None,
                          "token_ids": [], "block_size": 16, "lora_id": None, "medium": "DISK",
                          "lora_name": None},
                         {"type": "BlockRemoved", "block_hashes": [1], "medium": "DISK"}], 0],
    "map-batch": {"ts": 5.0, "events": [["AllBlocksCleared"]], "data_parallel_rank": 1},
    "bad-tag": [6.0, [["BlockMoved", [1]]], 0],
    # vLLM main's (0231dd5) tagged maps as kvtier writes them by default (docs/KV_EVENTS.md).
    "map-current-every-event": [
        7.0, [{"type": "BlockStored", "block_hashes": [7025492025366303769, 2**64 - 1],
               "parent_block_hash": None, "token_ids": list(range(1, 9)), "block_size": 4,
               "lora_id": None, "medium": "GPU", "lora_name": None},
              {"type": "BlockStored", "block_hashes": [12], "parent_block_hash": 11,
               "token_ids": [70000] * 4, "block_size": 4, "lora_id": None, "medium": "FS",
               "lora_name": None},
              {"type": "BlockRemoved", "block_hashes": [11, 12], "medium": "CPU"},
              {"type": "AllBlocksCleared"}], 3],
    "map-current-optional-fields": [
        8.0, [{"type": "BlockStored", "block_hashes": [1], "parent_block_hash": None,
               "token_ids": [1, 2], "block_size": 2, "lora_id": 3, "medium": "OBJ",
               "lora_name": "adapter", "extra_keys": [["mm", 1], None], "group_idx": 1,
               "kv_cache_spec_kind": "sliding_window", "kv_cache_spec_sliding_window": 128,
               "locality": "LOCAL"},
              {"type": "BlockRemoved", "block_hashes": [1], "medium": None, "group_idx": 1,
               "locality": "REMOTE"}]],
}
d = os.path.join(HERE, "corpus", "kv_events")
os.makedirs(d, exist_ok=True)
for name, msg in kv_seeds.items():
    with open(os.path.join(d, name), "wb") as f:
        f.write(msgpack.packb(msg))

# g4_value: G4 values (docs/G4.md) behind fuzz_g4_value's prefix (mode, expected ids,
# expected payload length). Their checksums are left 0: mode 2 has the fuzzer write both,
# mode 1 the header's; mode 0 sees them wrong. Bit 2 of the mode reads with a key (and in
# mode 3 writes with it): version 2 values, whose MAC the fuzzer cannot forge.


def g4_value(ids, payload, length=None, version=1):
    length = len(payload) if length is None else length
    return (b"KVG4" + struct.pack("<HH", version, 64) + struct.pack("<7Q", *ids, length, 0, 0)
            + payload)


def g4_input(mode, ids, length, value):
    return bytes([mode]) + struct.pack("<4QH", *ids, length) + value


ids = (0x1234, 0x99, 7, 0x1A7047)
payload = bytes(rng.randrange(256) for _ in range(300))
g4_seeds = {
    "valid": g4_input(2, ids, 300, g4_value(ids, payload)),
    "valid-empty": g4_input(2, ids, 0, g4_value(ids, b"")),
    "other-parent": g4_input(2, ids, 300, g4_value((0x1234, 0x98, 7, 0x1A7047), payload)),
    "other-layout": g4_input(2, ids, 300, g4_value((0x1234, 0x99, 7, 0x1A7048), payload)),
    "short": g4_input(2, ids, 300, g4_value(ids, payload)[:-1]),
    "bad-payload-sum": g4_input(1, ids, 300, g4_value(ids, payload)),
    "unchecked": g4_input(0, ids, 300, g4_value(ids, payload)),
    "garbage": g4_input(0, ids, 7, b"garbage"),
    "round-trip": g4_input(3, ids, 1000, payload),
    "keyed-round-trip": g4_input(4 | 3, ids, 1000, payload),
    "keyed-reader-unkeyed-value": g4_input(4 | 2, ids, 300, g4_value(ids, payload)),
    "keyed-made-up-mac": g4_input(4, ids, 300, g4_value(ids, payload, version=2)),
}
d = os.path.join(HERE, "corpus", "g4_value")
os.makedirs(d, exist_ok=True)
for name, data in g4_seeds.items():
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)

# replay_request: fuzz_replay_request's programs. A byte: messages - 1; per message a byte:
# frames - 1, then per frame a length byte (0x80 and up: 8 bytes, else len % 41) and its
# bytes; then two flags: read each reply before the next request, a client queue of one.


def replay_program(messages, read_each, queue_of_one):
    out = bytes([len(messages) - 1])
    for frames in messages:
        out += bytes([len(frames) - 1])
        for f in frames:
            out += bytes([0x80 if len(f) == 8 else len(f)]) + f
    return out + bytes([int(read_each), int(queue_of_one)])


def start(seq):
    return struct.pack(">Q", seq)


replay_seeds = {
    "one-request": replay_program([[b"", start(0)]], True, False),
    "tail": replay_program([[b"", start(4)]], False, False),
    "past-the-end": replay_program([[b"", start(2**63)]], True, False),
    "unread-flood": replay_program([[b"", start(0)]] * 4, False, True),
    "malformed-mix": replay_program([[start(0)], [b"", start(0), b"x"], [b"", b"abc"],
                                     [b"delim", start(3)]], False, False),
    "snapshot": replay_program([[b"", b"KVTIER_SNAPSHOT"], [b"", start(5)],
                                [b"", b"KVTIER_SNAPSHOT"]], True, False),
    "snapshot-unread": replay_program([[b"", b"KVTIER_SNAPSHOT"]] * 3, False, True),
}
d = os.path.join(HERE, "corpus", "replay_request")
os.makedirs(d, exist_ok=True)
for name, data in replay_seeds.items():
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)

# resp_reader: fuzz_resp_reader's input: the source's cut size (0: all at once), the size of
# the target a bulk may be placed into (2 bytes, LE), then what a server sends.


def resp_input(chunk, want, stream):
    return bytes([chunk]) + struct.pack("<H", want) + stream


value = bytes(range(256)) * 2
resp_seeds = {
    "set-replies": resp_input(0, 0, b"+OK\r\n" * 4 + b"-OOM command not allowed\r\n"),
    "exists": resp_input(3, 0, b":1\r\n:0\r\n:-1\r\n"),
    "get-placed": resp_input(7, len(value), b"$512\r\n" + value + b"\r\n$-1\r\n"),
    "get-other-size": resp_input(0, 100, b"$512\r\n" + value + b"\r\n:1\r\n"),
    "get-long": resp_input(64, 10, b"$5000\r\n" + bytes(5000) + b"\r\n+OK\r\n"),
    "array": resp_input(0, 0, b"*2\r\n$1\r\na\r\n$1\r\nb\r\n"),
    "resp3": resp_input(1, 0, b"_\r\n#t\r\n,1.5\r\n"),
    "huge-length": resp_input(0, 0, b"$1073741824\r\nabc"),
    "bad-crlf": resp_input(0, 3, b"$3\r\nabcXY"),
}
d = os.path.join(HERE, "corpus", "resp_reader")
os.makedirs(d, exist_ok=True)
for name, data in resp_seeds.items():
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)

# cluster_slots: fuzz_cluster_slots's input: the source's cut size (0: all at once), then a
# CLUSTER SLOTS answer (or an error's words, read as a redirection too).


def resp_int(v):
    return b":%d\r\n" % v


def resp_bulk(s):
    return b"$%d\r\n%s\r\n" % (len(s), s)


def resp_node(host, port, meta=b""):
    return (b"*4\r\n" if meta else b"*3\r\n") + resp_bulk(host) + resp_int(port) + \
        resp_bulk(b"0123456789abcdef0123456789abcdef01234567") + meta


meta = b"*2\r\n" + resp_bulk(b"hostname") + resp_bulk(b"node-a")
three = (b"*3\r\n" + b"*4\r\n" + resp_int(0) + resp_int(5460) +
         resp_node(b"127.0.0.1", 7000, meta) + resp_node(b"127.0.0.1", 7003) +
         b"*3\r\n" + resp_int(5461) + resp_int(10922) + resp_node(b"", 7001) +
         b"*3\r\n" + resp_int(10923) + resp_int(16383) + resp_node(b"::1", 7002))
cluster_seeds = {
    "three-masters": bytes([0]) + three,
    "three-masters-cut": bytes([3]) + three,
    "disabled": bytes([0]) + b"-ERR This instance has cluster support disabled\r\n",
    "moved": bytes([0]) + b"MOVED 3999 127.0.0.1:6381",
    "ask-v6": bytes([0]) + b"ASK 16383 [::1]:7001",
    "out-of-order": bytes([0]) + b"*1\r\n*3\r\n" + resp_int(9) + resp_int(1) +
    resp_node(b"h", 1),
    "deep": bytes([0]) + b"*1\r\n*4\r\n" + resp_int(0) + resp_int(5) + resp_node(b"h", 1) +
    b"*1\r\n" * 6 + resp_int(1),
}
d = os.path.join(HERE, "corpus", "cluster_slots")
os.makedirs(d, exist_ok=True)
for name, data in cluster_seeds.items():
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)
