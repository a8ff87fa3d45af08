"""What the KV-event tests share: the binaries, traces, free ports, and kvtier-replay
publishing its events."""
import json
import os
import random
import socket
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REPLAY = os.environ.get("KVTIER_REPLAY", str(ROOT / "build" / "bin" / "kvtier-replay"))
ROUTER = os.environ.get("KVTIER_ROUTER", str(ROOT / "build" / "bin" / "kvtier-router"))
LIB = os.environ.get("KVTIER_LIB", str(ROOT / "build" / "src" / "libkvtier.so"))
TRACE = ROOT / "examples" / "traces" / "conversation_trace.jsonl"
SALT = b"kvtier-replay"  # the salt kvtier-replay hashes with
TOKENS_PER_ID = 512      # a trace id's tokens: id * 512 + j


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def small_trace(path, requests=300, seed=11):
    """Requests that share prefixes of different lengths, as conversations do."""
    rng = random.Random(seed)
    prefixes, next_id, lines = [[]], 0, []
    for i in range(requests):
        base = list(rng.choice(prefixes))[: rng.randint(0, 12)]
        tail = list(range(next_id, next_id + rng.randint(1, 8)))
        next_id += len(tail)
        prefixes.append(base + tail)
        lines.append(json.dumps({"timestamp": i * 10, "input_length": 512 * len(base + tail),
                                 "output_length": 1, "hash_ids": base + tail}))
    Path(path).write_text("\n".join(lines) + "\n")
    return path


def replay_cmd(trace, pub_port, replay_port, dump, *args, hold=0):
    cmd = [REPLAY, "--trace", str(trace), "--json", "--no-progress", "--chunk-bytes", "64",
           "--kv-events", f"tcp://*:{pub_port}",
           "--kv-events-replay", f"tcp://*:{replay_port}",
           "--dump-registry", str(dump), *map(str, args)]
    if hold:
        cmd += ["--kv-events-hold", str(hold)]
    return cmd


def start_replay(tmp_path, *args, hold=0, trace=None, name="replay"):
    """Starts kvtier-replay publishing on two free ports; returns the process, the SUB and
    replay endpoints to connect to, and where its registry will be dumped."""
    if trace is None:
        trace = tmp_path / "small.jsonl"
        if not trace.exists():
            small_trace(trace)
    pub_port, replay_port = free_port(), free_port()
    dump = tmp_path / f"{name}-registry.json"
    proc = subprocess.Popen(replay_cmd(trace, pub_port, replay_port, dump, *args, hold=hold),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return (proc, f"tcp://127.0.0.1:{pub_port}", f"tcp://127.0.0.1:{replay_port}", dump)
