"""The management endpoint from Python: opened on a Unix socket, it answers JSON lines, counts
its clients, admits whom its config says, and goes before its manager and connector."""
import json
import os
import socket
import stat
import sys
import time

import pytest

from test_kvtier import manager, stored  # also puts the package on sys.path
import kvtier  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
import connector_seed003 as seed  # noqa: E402


def until(condition, timeout=10):
    """Polls condition until it holds (the endpoint's threads notice a client going on their
    own time); fails after timeout seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.001)


def ask(client, request):
    client.sendall(json.dumps(request).encode() + b"\n")
    return json.loads(client.makefile().readline())


def test_endpoint_answers_and_counts_its_clients(tmp_path):
    path = str(tmp_path / "m.sock")
    with manager() as m:
        m.release(stored(m, [1, 2]))
        with kvtier.Endpoint(m, path) as e:
            assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
            assert e.stats() == kvtier.EndpointStats(0, 0, 0, 0)
            with socket.socket(socket.AF_UNIX) as client:
                client.connect(path)
                reply = ask(client, {"cmd": "tiers"})
                assert reply["ok"] and reply["tiers"][0]["inactive"] == 2, reply
                s = e.stats()
                assert s.clients == 1 and s.peak_buffered_bytes > 0
            until(lambda: e.stats().clients == 0)
            with pytest.raises(kvtier.StateError):  # a live endpoint's socket is never taken
                kvtier.Endpoint(m, path)
        assert e.closed and not os.path.exists(path)
        with pytest.raises(kvtier.InvalidHandleError):
            e.stats()


def test_endpoint_config_limits_clients_and_admits_a_group(tmp_path):
    path = str(tmp_path / "m.sock")
    with manager() as m:
        with pytest.raises(kvtier.InvalidArgumentError, match="client_buffer_bytes"):
            kvtier.Endpoint(m, path, client_buffer_bytes=1)
        cfg = kvtier.EndpointConfig(max_clients=1, client_buffer_bytes=8192)
        with kvtier.Endpoint(m, path, config=cfg, allow_gid=os.getgid()) as e:
            assert stat.S_IMODE(os.stat(path).st_mode) == 0o660
            with socket.socket(socket.AF_UNIX) as first, socket.socket(socket.AF_UNIX) as second:
                first.connect(path)
                assert ask(first, {"cmd": "metrics"})["ok"]
                second.connect(path)
                refused = json.loads(second.makefile().readline())
                assert not refused["ok"] and "too many clients (1)" in refused["error"]
                assert e.stats().refused == 1
        with kvtier.Endpoint(m, path, allow_uid=os.getuid()):
            assert stat.S_IMODE(os.stat(path).st_mode) == 0o666


def test_endpoint_with_a_connector_closes_before_it(tmp_path):
    path = str(tmp_path / "c.sock")
    with seed.manager() as m:
        c = kvtier.Connector(m, role=kvtier.ROLE_SCHEDULER, num_gpu_blocks=8)
        e = kvtier.Endpoint(m, path, connector=c)
        c.get_num_new_matched_tokens("A", seed.TOKENS_A)
        assert 'kvtier_slots{state="initialized"} 1' in m.metrics_text(c)
        with socket.socket(socket.AF_UNIX) as client:
            client.connect(path)
            assert [s["req_id"] for s in ask(client, {"cmd": "slots"})["slots"]] == ["A"]
        c.close()  # the endpoint serves c: it goes first
        assert e.closed and not os.path.exists(path)
