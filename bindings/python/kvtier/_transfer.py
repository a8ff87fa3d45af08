"""Transfers (kvt_xfer) and the fences (kvt_fence) they may wait for."""
import asyncio
import threading
from typing import List, Optional

from ._enums import XferState, _member
from ._errors import OK, InvalidHandleError, TimeoutError, _check
from ._ffi import C, CONST, ffi
from ._util import _Handle, _to_list


class Transfer(_Handle):
    """An enqueued offload or onboard. wait() raises CancelledError for a cancelled one.
    close() (or leaving a with block) releases it; one not yet committed is cancelled.
    Any thread may close it while others wait(): their waits return, the transfer's
    cancellation or final outcome, before close() releases the C object."""
    _closed_error = InvalidHandleError
    _closed_message = "the transfer is released or its manager closed"

    def __init__(self, manager, x, n: int):
        self._m, self._n = manager, n
        self._cv = threading.Condition()  # guards the handle and _waiters
        self._waiters = 0
        self._own(x, self._cv)
        manager._transfers.add(self)

    def _parent_closed(self) -> bool:
        return self._m.closed

    def _free(self, x) -> None:
        """Waits in other threads end first: a transfer not yet committed is cancelled at
        once, one in flight finishes its copy."""
        if not self._m.closed:
            if self._waiters:
                C.kvt_xfer_cancel(x)
                self._cv.wait_for(lambda: self._waiters == 0)
            C.kvt_xfer_release(x)
        self._m._transfers.discard(self)

    release = _Handle.close

    def cancel(self) -> None:
        with self._cv:
            _check(C.kvt_xfer_cancel(self._live()))

    def wait(self, timeout: Optional[float] = None) -> int:
        """Waits for the end; returns the blocks moved. timeout in seconds (None: forever).
        TimeoutError when the transfer has not ended by then."""
        ns = -1 if timeout is None else int(timeout * 1e9)
        with self._cv:
            x = self._live()
            self._waiters += 1
        count = ffi.new("uint64_t *")
        try:
            st = C.kvt_xfer_wait(x, ns)  # the GIL is released: close() may run meanwhile
            if st == OK:
                st = C.kvt_xfer_status(ffi.NULL, ffi.NULL, count, x)
        finally:
            with self._cv:  # x stays alive until the last waiter is out
                self._waiters -= 1
                self._cv.notify_all()
        if st == CONST["KVT_TIMEOUT"]:  # its own message: kvt_last_error may be older
            raise TimeoutError("the transfer did not end within %g s" % timeout, st)
        _check(st)
        return count[0]

    async def wait_async(self, timeout: Optional[float] = None) -> int:
        """wait() without blocking the event loop: the wait runs in the loop's default
        executor (a transfer has no descriptor of its own to watch)."""
        return await asyncio.get_running_loop().run_in_executor(None, self.wait, timeout)

    def done(self) -> bool:
        with self._cv:
            return C.kvt_xfer_wait(self._live(), 0) != CONST["KVT_TIMEOUT"]

    @property
    def state(self) -> XferState:
        s = ffi.new("uint32_t *")
        with self._cv:
            _check(C.kvt_xfer_status(s, ffi.NULL, ffi.NULL, self._live()))
        return _member(XferState, s[0])

    @property
    def count(self) -> int:
        c = ffi.new("uint64_t *")
        with self._cv:
            _check(C.kvt_xfer_status(ffi.NULL, ffi.NULL, c, self._live()))
        return c[0]

    def blocks(self) -> List[int]:
        """After an onboard (or a G4 onboard) that ended OK: the final handles (dedup may
        swap some)."""
        out = ffi.new("kvt_block[]", max(self._n, 1))
        with self._cv:
            _check(C.kvt_xfer_blocks(out, self._n, self._live()))
        return _to_list(out, self._n)


class Fence(_Handle):
    """A precondition the host signals. close() destroys it; transfers still waiting on an
    unsignalled fence end cancelled."""
    _closed_error = InvalidHandleError
    _closed_message = "the fence is closed or its manager closed"

    def __init__(self, manager, f):
        self._m = manager
        self._own(f)

    def _parent_closed(self) -> bool:
        return self._m.closed

    def _free(self, f) -> None:
        if not self._m.closed:  # the manager's destroy freed it already
            C.kvt_fence_destroy(f)

    def signal(self) -> None:
        _check(C.kvt_fence_signal(self._live()))
