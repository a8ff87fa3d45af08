"""The library itself: its version and its diagnostics."""
import atexit
import logging
from typing import Callable, Union

from ._enums import LOG_DEBUG, LOG_ERROR, LOG_INFO, LOG_OFF, LOG_WARN
from ._ffi import C, ffi


def version() -> str:
    """"MAJOR.MINOR.PATCH" of the loaded library."""
    return ffi.string(C.kvt_version()).decode()


_LOGGING_LEVELS = {LOG_ERROR: logging.ERROR, LOG_WARN: logging.WARNING, LOG_INFO: logging.INFO,
                   LOG_DEBUG: logging.DEBUG}
_log_handler = None


@ffi.callback("kvt_log_fn")
def _log_callback(level, message, _user_data):
    """The one callback the library holds: a replaced handler is never called after."""
    handler = _log_handler
    if handler is not None:
        handler(level, ffi.string(message).decode(errors="replace"))


def set_log_handler(handler: Union[logging.Logger, Callable[[int, str], None], None],
                    level: int = LOG_WARN) -> None:
    """Sends the library's diagnostics at or below level (LOG_ERROR .. LOG_DEBUG) to
    handler: a logging.Logger (kvtier's levels map to logging's), or a callable
    handler(level, message). None turns them off (the default). Process-wide. The handler
    runs on whichever thread noticed the condition, possibly a library thread, and must not
    call kvtier; an exception it raises is printed and dropped."""
    global _log_handler
    if isinstance(handler, logging.Logger):
        logger = handler

        def handler(lvl, msg):
            logger.log(_LOGGING_LEVELS.get(lvl, logging.DEBUG), "%s", msg)
    _log_handler = handler
    if handler is None:
        C.kvt_log_set_callback(LOG_OFF, ffi.NULL, ffi.NULL)
    else:
        C.kvt_log_set_callback(level, _log_callback, ffi.NULL)


@atexit.register
def _log_off():
    """No callback into an interpreter that is shutting down."""
    if _log_handler is not None:
        C.kvt_log_set_callback(LOG_OFF, ffi.NULL, ffi.NULL)
