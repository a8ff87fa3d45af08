"""--metrics-port under hostile clients: idle connections, a client that drips its request a
byte at a time, more connections than the server's cap, and an over-long head must not keep a
scrape from being answered. Run by ctest with KVTIER_REPLAY set to the binary."""
import os
import select
import socket
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
REPLAY = os.environ.get("KVTIER_REPLAY", str(ROOT / "build" / "bin" / "kvtier-replay"))
TRACE = ROOT / "examples" / "traces" / "conversation_trace.jsonl"
MAX_CLIENTS = 64  # MetricsServer::kMaxClients


def scrape(port, timeout):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout) as r:
        return r.status, r.read().decode()


@pytest.fixture
def port(tmp_path):
    """A blocks-mode replay of a short trace that keeps its manager, and so its metrics
    port, up for a while after the replay; the first scrape answered means it is up."""
    trace = tmp_path / "short.jsonl"
    with open(TRACE) as f:
        trace.write_text("".join(line for _, line in zip(range(50), f)))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = subprocess.Popen([REPLAY, "--trace", trace, "--metrics-port", str(port),
                          "--kv-events-hold", "300", "--chunk-bytes", "64", "--no-progress"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert p.poll() is None, "kvtier-replay ended"
            try:
                assert scrape(port, 5)[0] == 200
                break
            except OSError:
                assert time.monotonic() < deadline, "no scrape answered within 60 s"
                time.sleep(0.05)
        yield port
        assert p.poll() is None, "kvtier-replay ended during the test"
    finally:
        p.kill()
        p.wait()


def idle_connections(port, n):
    """n connections that send nothing; non-blocking, so a full backlog cannot stall us."""
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", port))
        socks.append(s)
    return socks


def closed_by_server(s):
    """Whether the server has closed s: it reads EOF (or a reset) without waiting."""
    if not select.select([s], [], [], 0)[0]:
        return False
    try:
        return s.recv(1) == b""
    except OSError:
        return True


class Dripper(threading.Thread):
    """Sends an endless request head a byte every 0.5 s until the server closes it or the
    test stops it; `closed` is set when the server closed it."""

    def __init__(self, port):
        super().__init__(daemon=True)
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.sock.setblocking(False)
        self.sent = 0
        self.closed = threading.Event()
        self.stopped = threading.Event()

    def run(self):
        head = b"GET /metrics HTTP/1.1\r\nX-Slow: " + b"a" * 1_000_000
        while not self.stopped.is_set():
            try:
                self.sock.send(head[self.sent:self.sent + 1])
                self.sent += 1
            except OSError:
                self.closed.set()
                return
            if self.stopped.wait(0.5):
                return
            if closed_by_server(self.sock):
                self.closed.set()
                return

    def stop(self):
        self.stopped.set()
        self.join()
        self.sock.close()


def test_a_scrape_is_answered_while_idle_and_dripping_clients_hold_connections(port):
    idle = idle_connections(port, 40)
    dripper = Dripper(port)
    dripper.start()
    try:
        while dripper.sent == 0:
            time.sleep(0.01)
        status, text = scrape(port, 60)  # the old server never answered: fail, not hang
        assert not dripper.closed.is_set() and dripper.is_alive(), "dripper gone before"
        assert status == 200 and "kvtier_tier_blocks" in text
    finally:
        dripper.stop()
        for s in idle:
            s.close()


def test_a_scrape_is_answered_past_the_connection_cap(port):
    # Blocking connects, one after another: the server accepts them in this order.
    idle = [socket.create_connection(("127.0.0.1", port), timeout=10)
            for _ in range(3 * MAX_CLIENTS)]
    try:
        status, text = scrape(port, 60)
        assert status == 200 and "kvtier_tier_blocks" in text
        # Room was made by closing the oldest connections, not by waiting for the newest
        # one's request deadline.
        assert closed_by_server(idle[0]) and not closed_by_server(idle[-1])
    finally:
        for s in idle:
            s.close()


def test_a_client_that_drips_its_request_is_closed_at_its_deadline(port):
    dripper = Dripper(port)
    dripper.start()
    try:
        assert dripper.closed.wait(60), "the server kept a dripping client for 60 s"
        assert dripper.sent < 20, "closed long after the 2 s request deadline"
    finally:
        dripper.stop()


def test_a_request_head_over_8_kib_is_closed_unanswered(port):
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        try:
            s.sendall(b"GET /metrics HTTP/1.1\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n")
        except OSError:
            return  # closed while we were still sending
        try:
            assert s.recv(1) == b""
        except ConnectionResetError:
            pass
