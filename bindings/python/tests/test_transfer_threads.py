"""Transfers shared between threads: close() during another thread's wait(), and timeouts
that report themselves, not an older failure."""
import threading

import pytest

from test_kvtier import manager, stored  # also puts the package on sys.path
import kvtier  # noqa: E402


def waiting(x):
    """Starts a thread in x.wait() and returns it once the wait is inside the library."""
    result = {}

    def run():
        try:
            result["count"] = x.wait()
        except kvtier.Error as e:
            result["error"] = e

    t = threading.Thread(target=run)
    t.start()
    while x._waiters == 0 and t.is_alive():
        pass
    return t, result


def test_close_during_wait_on_a_fenced_transfer_cancels_the_wait():
    with manager(min_batch_size=1) as m:
        a = stored(m, [70, 71])
        f = m.fence()
        x = m.offload(a, kvtier.G2, fence=f)
        t, result = waiting(x)
        x.close()  # the fence never comes: the waiter must be woken, not left on freed memory
        t.join(10)
        assert not t.is_alive()
        assert isinstance(result.get("error"), kvtier.CancelledError), result
        with pytest.raises(kvtier.InvalidHandleError):
            x.wait()
        f.close()
        assert m.match_prefix([70], kvtier.G2) == []
        m.release(a)
        m.check()


def test_close_races_with_waits_on_running_transfers():
    with manager(g1_blocks=64, g2_blocks=64) as m:
        for i in range(60):
            a = stored(m, [1000 + 2 * i, 1001 + 2 * i])
            x = m.offload(a, kvtier.G2)
            t, result = waiting(x)
            x.close()
            t.join(10)
            assert not t.is_alive()
            # The wait saw the transfer's own end: moved both blocks, or was cancelled.
            if "error" in result:
                assert isinstance(result["error"], kvtier.CancelledError), result
            else:
                assert result["count"] == 2
            m.release(a)
        m.check()


def test_manager_close_wakes_a_waiting_thread():
    m = manager(min_batch_size=1)
    a = stored(m, [80])
    f = m.fence()
    x = m.offload(a, kvtier.G2, fence=f)
    t, result = waiting(x)
    m.close()
    t.join(10)
    assert isinstance(result.get("error"), kvtier.CancelledError), result


def test_timeout_reports_the_timeout_not_an_older_failure():
    with manager(min_batch_size=1) as m:
        a = stored(m, [90])
        f = m.fence()
        with m.offload(a, kvtier.G2, fence=f) as x:
            with pytest.raises(kvtier.NoSpaceError) as older:
                m.alloc(100000)  # leaves its message in kvt_last_error on this thread
            with pytest.raises(kvtier.TimeoutError) as e:
                x.wait(0.01)
            assert e.value.status == kvtier.TimeoutError.status
            assert older.value.message not in e.value.message
            assert "did not end" in e.value.message or "time" in e.value.message
        f.close()
        m.release(a)
