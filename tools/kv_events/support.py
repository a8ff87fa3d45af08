"""What the KV-event tests share: the binaries, traces, free ports, kvtier's hashes, and
kvtier-replay publishing its events."""
import array
import ctypes
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


class LibHasher:
    """kvtier's sequence hashes (kvt_hash_salt, kvt_hash_tokens) through its C ABI."""

    def __init__(self, salt, page_size):
        self.lib = ctypes.CDLL(LIB)
        self.page = page_size
        self.salt = ctypes.c_uint64()
        assert self.lib.kvt_hash_salt(ctypes.byref(self.salt), salt, len(salt)) == 0

    def hashes(self, tokens):
        n = len(tokens) // self.page
        out = (ctypes.c_uint64 * max(n, 1))()
        got = ctypes.c_size_t()
        arr = (ctypes.c_uint32 * len(tokens)).from_buffer(array.array("I", tokens))
        assert self.lib.kvt_hash_tokens(out, ctypes.c_size_t(n), ctypes.byref(got), self.salt,
                                        arr, ctypes.c_size_t(len(tokens)),
                                        ctypes.c_uint32(self.page)) == 0
        return list(out[: got.value])


_HANDED_OUT = set()


def free_port():
    """A TCP port free now, outside the kernel's ephemeral range, and not handed out before.
    A port the kernel picks (bind to 0) is one it may also give, a moment later, to an
    outgoing connection as its local port (the router's ZMQ reconnects to instances not yet
    up make many): the server that binds it after that fails with "Address already in use".
    The kernel never gives ports outside the range to outgoing connections."""
    low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    pool = [p for p in (*range(10000, low), *range(high + 1, 65536)) if p not in _HANDED_OUT]
    if not pool:  # the whole range is ephemeral here: the kernel's choice it is
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]
    rng = random.Random()
    for _ in range(1000):
        port = rng.choice(pool)
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    raise RuntimeError("no free TCP port outside the ephemeral range")


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


class ReplayRun:
    """A kvtier-replay process publishing its KV events on two free ports (bound, as the
    endpoints have a wildcard): subscribers may connect before start()."""

    def __init__(self, tmp_path, name="replay"):
        pub_port, replay_port = free_port(), free_port()
        self.ports = (pub_port, replay_port)
        self.sub = f"tcp://127.0.0.1:{pub_port}"
        self.replay = f"tcp://127.0.0.1:{replay_port}"
        self.dump = tmp_path / f"{name}-registry.json"
        self.tmp_path = tmp_path
        self.proc = None

    def start(self, *args, hold=0, trace=None):
        if trace is None:
            trace = self.tmp_path / "small.jsonl"
            if not trace.exists():
                small_trace(trace)
        self.proc = subprocess.Popen(replay_cmd(trace, *self.ports, self.dump, *args, hold=hold),
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        return self

    def finish(self, timeout=120):
        """Waits for the process; returns its JSON report."""
        out, err = self.proc.communicate(timeout=timeout)
        assert self.proc.returncode == 0, err
        return json.loads(out)

    def registry(self):
        """{"G1": set, "G2": set, "G3": set} of what the manager held at the end."""
        reg = json.loads(Path(self.dump).read_text())
        return {t: set(reg.get(t, [])) for t in ("G1", "G2", "G3")}
