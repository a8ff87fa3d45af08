"""One exception class per kvt_status, all under Error, and the checks that raise them."""
import builtins
from typing import NoReturn, Optional

from ._ffi import C, CONST, ffi

OK = CONST["KVT_OK"]
# The positive statuses are outcomes, not errors (docs/CONVENTIONS.md, "Statuses and errors"):
# KVT_AGAIN (nothing is ready yet) and KVT_ITEROVER (an iteration has no more items) have no
# class, the calls that return them handle them; KVT_TIMEOUT is TimeoutError, which waits raise.
AGAIN, TIMEOUT, ITEROVER = CONST["KVT_AGAIN"], CONST["KVT_TIMEOUT"], CONST["KVT_ITEROVER"]


class Error(Exception):
    """A kvtier failure: .status is the kvt_status, .message the library's explanation."""
    status: Optional[int] = None

    def __init__(self, message: str, status: Optional[int] = None):
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status


def _error_class(name, status_name, doc):
    return type(name, (Error,), {"status": CONST[status_name], "__doc__": doc})


InvalidArgumentError = _error_class("InvalidArgumentError", "KVT_ERR_INVALID_ARGUMENT", "bad argument")
InvalidHandleError = _error_class("InvalidHandleError", "KVT_ERR_INVALID_HANDLE",
                                  "unknown, foreign, stale or closed handle")
StateError = _error_class("StateError", "KVT_ERR_STATE", "the call does not fit the state")
NoSpaceError = _error_class("NoSpaceError", "KVT_ERR_NO_SPACE", "a tier is full")
CancelledError = _error_class("CancelledError", "KVT_ERR_CANCELLED",
                              "the transfer was cancelled: not a failure of the copy")
UnsupportedError = _error_class("UnsupportedError", "KVT_ERR_UNSUPPORTED", "unsupported")
IoError = _error_class("IoError", "KVT_ERR_IO", "G3 or G4 I/O failed")
CorruptError = _error_class("CorruptError", "KVT_ERR_CORRUPT", "checksum or hash mismatch")
NoMemoryError = _error_class("NoMemoryError", "KVT_ERR_NO_MEMORY", "out of memory")
CudaError = _error_class("CudaError", "KVT_ERR_CUDA", "a CUDA call failed")
NotFoundError = _error_class("NotFoundError", "KVT_ERR_NOT_FOUND",
                             "an unknown request id (never seen, or finished), a missing G4 key "
                             "or an unknown breakpoint")
InternalError = _error_class("InternalError", "KVT_ERR_INTERNAL", "a bug in kvtier")


class TimeoutError(Error, builtins.TimeoutError):
    """A wait ran out of time (KVT_TIMEOUT)."""
    status = TIMEOUT


_BY_STATUS = {c.status: c for c in (
    InvalidArgumentError, InvalidHandleError, StateError, NoSpaceError, CancelledError,
    UnsupportedError, IoError, CorruptError, NoMemoryError, CudaError, NotFoundError,
    InternalError, TimeoutError)}


def _error(status: int) -> Error:
    """The exception for a failed call's status, with kvt_last_error() as its message."""
    msg = ffi.string(C.kvt_last_error()).decode(errors="replace")
    cls = _BY_STATUS.get(status, Error)
    return cls(msg or ffi.string(C.kvt_status_str(status)).decode(), status)


def _raise(status: int) -> NoReturn:
    raise _error(status)


def _check(status: int) -> None:
    if status != OK:
        _raise(status)


def _invalid(message: str) -> InvalidArgumentError:
    return InvalidArgumentError(message, InvalidArgumentError.status)


def _call(fn, *args) -> None:
    """Calls fn and raises the binding's error for its status; an argument C cannot take (a
    negative count, a layer that is not an int) is an InvalidArgumentError, not a cffi one."""
    try:
        status = fn(*args)
    except (OverflowError, TypeError) as e:
        raise _invalid("%s: %s" % (fn.__name__, e)) from None
    _check(status)
