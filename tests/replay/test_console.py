"""kvtier-console as a person uses it: under tmux, against a running kvtier-replay --mode
engine --console-socket, driven with send-keys and read with capture-pane. A breakpoint on
ONBOARDING set from the console pauses the replay with a slot in ONBOARDING on the screen;
clearing it and resuming lets that request move on. Run by ctest (replay_pytest) with
KVTIER_REPLAY and KVTIER_CONSOLE set."""
import os
import re
import shutil
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


def slot_state(s, req):
    m = re.search(rf"^[> ] {re.escape(req)}\s+(\S+)", s, re.M)
    return m.group(1) if m else None


@pytest.mark.skipif(shutil.which("tmux") is None, reason="SKIPPED LOUDLY: tmux is not installed")
def test_a_breakpoint_set_in_the_console_pauses_the_replay_at_onboarding(tmp_path):
    sock = tmp_path / "kvtier.sock"
    session = f"kvtier-console-test-{os.getpid()}"
    replay = subprocess.Popen([REPLAY, "--trace", TRACE, "--mode", "engine", "--chunk-bytes",
                               "64", "--no-progress", "--console-socket", sock],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while not sock.exists():
            assert replay.poll() is None, replay.stderr.read().decode()
            assert time.monotonic() < deadline, "no socket"
            time.sleep(0.02)
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
