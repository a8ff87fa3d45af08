"""close() while other threads are inside calls on the same handle: it refuses new calls, lets
a call paused at a breakpoint go, waits for the calls in flight, and only then destroys the
C object (kvtier.h: "Every handle is destroyed once, when no other call on it runs"). Each
call either completes or raises the closed error; none runs on freed memory. Real threads;
the tests wait for conditions, never for a fixed time."""
import itertools
import os
import sys
import threading

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))
import kvtier  # noqa: E402
import connector_seed003 as seed  # noqa: E402

JOIN_S = 60  # a bound on waiting for a thread, so that a regression fails, not hangs


def joined(t):
    t.join(JOIN_S)
    assert not t.is_alive(), "%s did not end" % t.name
    return t


def run(target, name):
    """target on a new thread; the thread, and a dict with what target returned ("value")
    or raised ("error")."""
    result = {}

    def body():
        try:
            result["value"] = target()
        except BaseException as e:  # noqa: B902: the test reports it
            result["error"] = e

    t = threading.Thread(target=body, name=name, daemon=True)
    t.start()
    return t, result


@pytest.mark.parametrize("closing", ["connector", "manager"])
def test_close_lets_a_call_paused_at_a_breakpoint_go(closing):
    """A scheduler call paused at a breakpoint (for up to an hour) on one thread, the
    connector (or its manager, which closes the connector first) closed on another: close()
    resumes the pause, waits for the call to return, then destroys the connector."""
    m = seed.manager()
    c = kvtier.Connector(m, role=kvtier.ROLE_SCHEDULER, num_gpu_blocks=seed.NUM_GPU_BLOCKS,
                         pause_timeout_ms=3600000)
    order, lock = [], threading.Lock()

    def finished(trigger, req_id, status):  # runs inside the C call, before it returns
        with lock:
            order.append(("call finished", trigger))

    assert c.get_num_new_matched_tokens("A", seed.TOKENS_A, 0) == (0, False)
    c.set_hooks(finished_call=finished)
    bp = c.add_breakpoint(req_id="A")
    engine, called = run(lambda: c.update_state_after_alloc("A", [1, 2, 3], 0), "engine")
    p = c.wait_paused(JOIN_S * 1000)
    assert p is not None and p["breakpoint"] == bp and p["req_id"] == "A"
    assert len(c._gate.calls) == 1  # the paused call, counted

    def close():
        (c if closing == "connector" else m).close()
        with lock:
            order.append(("closed", None))

    closer, closed = run(close, "closer")
    joined(closer)
    joined(engine)
    assert "error" not in closed, closed
    # Whatever the library says of the call cut short, it returned, and before the destroy.
    assert "error" not in called or isinstance(called["error"], kvtier.Error), called
    assert [what for what, _ in order] == ["call finished", "closed"], order
    assert order[0][1] == kvtier.C.KVT_TRIGGER_UPDATE_STATE_AFTER_ALLOC
    assert c.closed and c._gate.calls == []
    with pytest.raises(kvtier.InvalidHandleError):
        c.stats()
    with pytest.raises(kvtier.InvalidHandleError):
        c.wait_paused(0)
    if closing == "connector":
        m.check()  # the manager lives on, its pins released
        m.close()
    assert m.closed


def test_close_waits_out_a_blocking_call():
    """wait_paused blocks in the library until a pause comes or its timeout ends, and
    nothing cuts it short: a close() meanwhile refuses new calls at once and destroys the
    connector once the wait has returned."""
    m = seed.manager()
    c = kvtier.Connector(m, role=kvtier.ROLE_SCHEDULER, num_gpu_blocks=seed.NUM_GPU_BLOCKS)
    waiter, waited = run(lambda: c.wait_paused(300), "waiter")
    while not c._gate.calls and waiter.is_alive():  # until the wait is in flight
        pass
    closer, closed = run(m.close, "closer")  # the manager's close closes the connector first
    while not c._gate.shut and closer.is_alive():
        pass
    with pytest.raises(kvtier.InvalidHandleError):  # closing or closed: no new call enters
        c.stats()
    with pytest.raises(kvtier.InvalidHandleError):
        c.get_num_new_matched_tokens("A", seed.TOKENS_A, 0)
    joined(closer)
    joined(waiter)
    assert closed == {"value": None} and waited == {"value": None}, (closed, waited)
    assert c.closed and m.closed and c._gate.calls == [] and m._gate.calls == []


def hammer(handle, calls, closed_error, threads=8, warmup=20):
    """threads threads, each making the calls in turn until one raises closed_error; once
    each has made warmup rounds, another thread closes handle. What each thread ended with:
    "closed" (the closed error, after warmup rounds of successes), or what else it raised."""
    rounds = [0] * threads
    ready = threading.Condition()
    ends = [None] * threads

    def worker(i):
        try:
            while True:
                for call in calls:
                    call()
                with ready:
                    rounds[i] += 1
                    ready.notify_all()
        except closed_error as e:
            assert e.status == closed_error.status
            ends[i] = "closed" if rounds[i] >= warmup else "closed early"
        except BaseException as e:  # noqa: B902: the test reports it
            ends[i] = "%s: %s" % (type(e).__name__, e)

    workers = [threading.Thread(target=worker, args=(i,), name="worker %d" % i, daemon=True)
               for i in range(threads)]
    for t in workers:
        t.start()
    with ready:
        assert ready.wait_for(lambda: min(rounds) >= warmup or
                              not all(t.is_alive() for t in workers), JOIN_S), rounds
    closer, closed = run(handle.close, "closer")
    joined(closer)
    for t in workers:
        joined(t)
    assert closed == {"value": None}, closed
    assert handle.closed and handle._gate.calls == []
    return ends


def test_threads_calling_a_manager_while_another_closes_it():
    m = kvtier.Manager(page_size=4, num_layers=1, num_outer=2, chunk_bytes=64, g1_blocks=256,
                       g2_blocks=16, g3_blocks=0)
    fresh = itertools.count(1000, 2)  # next() is atomic: a hash pair per call

    def alloc_register_release():
        h = next(fresh)
        m.release(m.register_hashes(m.alloc(2), [h, h + 1]))

    def match():
        m.release(m.match_prefix([1, 2, 3]))

    def subscribe():
        with m.subscribe(16) as s:
            s.drain()

    def fence():
        m.fence().close()

    calls = [alloc_register_release, match, lambda: m.tier_stats(kvtier.G1),
             lambda: m.transfer_stats(kvtier.G1, kvtier.G2), m.check, m.tier_hashes,
             m.metrics_text, m.poll, subscribe, fence, lambda: m.evictable(8)]
    ends = hammer(m, calls, kvtier.InvalidHandleError)
    assert ends == ["closed"] * len(ends), ends
    with pytest.raises(kvtier.InvalidHandleError):
        m.alloc(1)


def test_threads_calling_a_connector_while_another_closes_it():
    m = seed.manager()
    c = seed.connector(m)  # both halves
    c.register_kv_caches(seed.Engine().layout(), seed.NUM_GPU_BLOCKS)
    calls = [lambda: c.get_num_new_matched_tokens("A", seed.TOKENS_A, 0), c.stats, c.slots,
             c.batches, c.take_events, lambda: c.wait_paused(0),
             lambda: c.build_connector_meta([]), c.get_finished,
             lambda: m.metrics_text(c)]
    ends = hammer(c, calls, kvtier.InvalidHandleError)
    assert ends == ["closed"] * len(ends), ends
    m.check()
    m.close()


def test_a_subscription_and_an_event_log_closed_under_their_readers(tmp_path):
    m = kvtier.Manager(page_size=4, num_layers=1, num_outer=2, chunk_bytes=64, g1_blocks=64,
                       g2_blocks=0, g3_blocks=0)  # a block for each thread at least
    s = m.subscribe(64)
    ends = hammer(s, [s.drain, s.fileno, lambda: m.release(m.alloc(1))], kvtier.StateError)
    assert ends == ["closed"] * len(ends), ends
    log = tmp_path / "run.kvtlog"
    m.record(log)
    for _ in range(4):
        m.release(m.alloc(1))
    m.stop_recording()
    m.close()
    with kvtier.EventLog(log) as reader:
        ends = hammer(reader, [lambda: list(reader)], kvtier.InvalidHandleError)
    assert ends == ["closed"] * len(ends), ends
