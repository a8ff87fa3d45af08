"""The management endpoint of a running kvtier-replay --mode engine --console-socket, and
kvtier-console as a person uses it: under tmux, driven with send-keys and read with
capture-pane. A breakpoint on ONBOARDING set from the console pauses the replay with a slot
in ONBOARDING on the screen; clearing it and resuming lets that request move on. The
endpoint refuses bad requests and outlives clients that vanish or never read. Run by ctest
(replay_pytest) with KVTIER_REPLAY and KVTIER_CONSOLE set."""
import json
import os
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
REPLAY = os.environ.get("KVTIER_REPLAY", str(ROOT / "build" / "bin" / "kvtier-replay"))
CONSOLE = os.environ.get("KVTIER_CONSOLE", str(ROOT / "build" / "bin" / "kvtier-console"))
TRACE = ROOT / "examples" / "traces" / "conversation_trace.jsonl"


def tmux(*args):
    return subprocess.run(["tmux", *args], capture_output=True, text=True, check=True).stdout


def screen(session):
    return tmux("capture-pane", "-p", "-t", session)


def wait_for(session, pred, what, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s = screen(session)
        if pred(s):
            return s
        time.sleep(0.1)
    pytest.fail(f"the console never showed {what}; last screen:\n{screen(session)}")


def wait_for_socket(replay, sock):
    deadline = time.monotonic() + 30
    while not sock.exists():
        assert replay.poll() is None, replay.stderr.read().decode()
        assert time.monotonic() < deadline, "no socket within 30 s"
        time.sleep(0.02)


def start_replay(sock):
    return subprocess.Popen([REPLAY, "--trace", TRACE, "--mode", "engine", "--chunk-bytes", "64",
                             "--no-progress", "--console-socket", sock],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def slot_state(s, req):
    m = re.search(rf"^[> ] {re.escape(req)}\s+(\S+)", s, re.M)
    return m.group(1) if m else None


@pytest.mark.skipif(shutil.which("tmux") is None, reason="SKIPPED LOUDLY: tmux is not installed")
def test_a_breakpoint_set_in_the_console_pauses_the_replay_at_onboarding(tmp_path):
    sock = tmp_path / "kvtier.sock"
    session = f"kvtier-console-test-{os.getpid()}"
    replay = start_replay(sock)
    try:
        wait_for_socket(replay, sock)
        tmux("new-session", "-d", "-s", session, "-x", "160", "-y", "50", f"{CONSOLE} {sock}")
        wait_for(session, lambda s: "RUNNING" in s and "SLOTS (" in s, "the running replay")

        tmux("send-keys", "-t", session, "b")
        wait_for(session, lambda s: "break when a slot enters state:" in s, "the prompt")
        tmux("send-keys", "-t", session, "ONBOARDING", "Enter")
        s = wait_for(session, lambda s: "PAUSED at" in s, "the pause")
        req = re.search(r"PAUSED at (\S+): ONBOARD_STAGED -> ONBOARDING by "
                        r"UPDATE_STATE_AFTER_ALLOC", s)
        assert req, s
        req = req.group(1)
        assert "breakpoints: ONBOARDING" in s
        assert slot_state(s, req) == "ONBOARDING", s
        assert re.search(rf"batch \d+\s+{re.escape(req)}\s+G[23] -> G1\s+\d+ blocks\s+planned", s), s
        assert f"TIMELINE {req}" in s and "SLOT ONBOARD_STAGED -> ONBOARDING" in s, s
        time.sleep(0.5)  # the replay stays where it is
        s = screen(session)
        assert f"PAUSED at {req}:" in s and slot_state(s, req) == "ONBOARDING", s
        assert replay.poll() is None

        tmux("send-keys", "-t", session, "c")
        wait_for(session, lambda s: "breakpoints: none" in s, "the breakpoint cleared")
        tmux("send-keys", "-t", session, "r")
        s = wait_for(session, lambda s: "RUNNING" in s and slot_state(s, req) != "ONBOARDING",
                     f"{req} moving on")
        assert slot_state(s, req) in (None, "PREFILLING", "DECODING", "PREEMPTED",
                                      "SKIPPED_PREFILL", "FINISHING"), s
        tmux("send-keys", "-t", session, "q")
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
        replay.kill()
        replay.wait()


def ask(f, req):
    f.write((req if isinstance(req, str) else json.dumps(req)) + "\n")
    f.flush()
    return json.loads(f.readline())


def test_the_endpoint_refuses_bad_requests_and_survives_clients_that_vanish(tmp_path):
    sock = tmp_path / "kvtier.sock"
    replay = start_replay(sock)
    try:
        wait_for_socket(replay, sock)
        # A subscriber that reads two events and vanishes, and one that never reads.
        for _ in range(3):
            s = socket.socket(socket.AF_UNIX)
            s.connect(str(sock))
            f = s.makefile("rw")
            assert ask(f, {"cmd": "subscribe"}) == {"ok": True}
            assert "event" in json.loads(f.readline()) and "event" in json.loads(f.readline())
            s.close()
        idle = socket.socket(socket.AF_UNIX)
        idle.connect(str(sock))
        idle.sendall(b'{"cmd":"subscribe"}\n')

        s = socket.socket(socket.AF_UNIX)
        s.connect(str(sock))
        f = s.makefile("rw")
        for bad, why in [("not json", "malformed request"), ('["cmd"]', "a JSON object"),
                         ({"cmd": 7}, "a JSON object"), ({"cmd": "nope"}, "unknown cmd 'nope'"),
                         ({"cmd": "break"}, "needs \"state\" or \"req_id\""),
                         ({"cmd": "break", "state": "SLEEPING"}, "not a slot state"),
                         ({"cmd": "break", "req_id": ""}, "1 to 255 bytes"),
                         ({"cmd": "clear", "id": 999}, "no such breakpoint"),
                         ({"cmd": "timeline"}, "needs a string \"req_id\"")]:
            r = ask(f, bad)
            assert r["ok"] is False and why in r["error"], (bad, r)
        r = ask(f, {"cmd": "resume"})
        assert r["ok"] is False and r["error"] == "nothing is paused"
        # The timeline is recorded from the first client on: a request seen by the connector
        # since then has one of SLOT and other events.
        deadline = time.monotonic() + 60
        tl = []
        while not tl:
            assert time.monotonic() < deadline, "no request got a timeline in 60 s"
            for slot in ask(f, {"cmd": "slots"})["slots"]:
                tl = tl or ask(f, {"cmd": "timeline", "req_id": slot["req_id"]})["events"]
        assert tl[0]["kind"] in ("SLOT", "CANDIDATE", "TRANSFER", "CALL"), tl
        assert "kvtier_slots{" in ask(f, {"cmd": "metrics"})["text"]
        # An over-long line is refused and the connection closed; the endpoint stays up.
        s2 = socket.socket(socket.AF_UNIX)
        s2.connect(str(sock))
        s2.sendall(b"x" * (70 << 10))
        reply = s2.makefile("r").readline()
        assert "longer than 64 KiB" in reply
        assert ask(f, {"cmd": "tiers"})["ok"] is True
        assert replay.poll() is None
        idle.close()
    finally:
        replay.kill()
        replay.wait()


def test_a_replay_killed_with_sigkill_comes_back_on_its_socket(tmp_path):
    """Issue 24, finding 5: kill -9 leaves the socket file, and the restarted engine failed to
    create its connector ("Address already in use"): a crash-looping engine never came back.
    The socket of an owner that has ended is replaced; that of a live one never is."""
    sock = tmp_path / "kvtier.sock"
    first = start_replay(sock)
    try:
        wait_for_socket(first, sock)
        first.kill()  # SIGKILL: nothing is cleaned up
        first.wait()
        assert sock.exists(), "kill -9 left no socket: nothing to test"
        second = start_replay(sock)
        try:
            deadline = time.monotonic() + 30
            while True:
                assert second.poll() is None, second.stderr.read().decode()
                try:
                    s = socket.socket(socket.AF_UNIX)
                    s.connect(str(sock))
                    break
                except (ConnectionRefusedError, FileNotFoundError):
                    s.close()
                    assert time.monotonic() < deadline, "the restarted replay never served"
                    time.sleep(0.02)
            assert ask(s.makefile("rw"), {"cmd": "tiers"})["ok"] is True
            assert oct(sock.stat().st_mode & 0o777) == "0o600"
            # While it lives, a third one is refused and leaves the second's socket alone.
            third = subprocess.run([REPLAY, "--trace", TRACE, "--mode", "engine", "--no-progress",
                                    "--console-socket", sock], capture_output=True, text=True,
                                   timeout=120)
            assert third.returncode != 0
            assert "served by a live process" in third.stderr, third.stderr
            assert ask(s.makefile("rw"), {"cmd": "tiers"})["ok"] is True
            s.close()
        finally:
            second.kill()
            second.wait()
    finally:
        first.kill()
        first.wait()
