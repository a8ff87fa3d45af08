"""The management endpoint (kvt_endpoint): a manager, and optionally its connector, served on a
Unix socket for kvtier-console and scripts (docs/EVENTS.md, "The management endpoint")."""
import dataclasses
import os
from typing import Optional, Union

from ._config import EndpointConfig, _merged
from ._errors import InvalidHandleError, _check
from ._ffi import C, ffi
from ._util import _NO_HANDLE, _Handle, _path, _Record, _versioned


@dataclasses.dataclass(frozen=True)
class EndpointStats(_Record):
    """kvt_endpoint_stats: the clients connected now, those turned away (beyond max_clients,
    or a user not allowed), those closed (a line over 64 KiB, replies unread 30 s), and the
    most reply bytes one client has had waiting."""
    _ctype = "kvt_endpoint_stats"

    clients: int
    refused: int
    dropped: int
    peak_buffered_bytes: int


class Endpoint(_Handle):
    """Serves manager (and connector, a Connector over it) on a new Unix socket at path, one
    JSON object per line each way, until close(). Without a config or fields it opens with
    the library's defaults (kvt_endpoint_open), else with them (kvt_endpoint_open_with):
    Endpoint(m, path, max_clients=4, allow_gid=os.getgid()). Closing the manager or the
    connector closes it first, as the library requires."""
    _closed_error = InvalidHandleError
    _closed_message = "the endpoint is closed"

    def __init__(self, manager, path: Union[str, bytes, os.PathLike], connector=None,
                 config: Optional[EndpointConfig] = None, **fields):
        out = ffi.new("kvt_endpoint **")
        cfg = None
        if config is not None or fields:
            cfg, _ = _merged(EndpointConfig, config, fields, "endpoint config")._cdata()
        # Inside both gates: their close() finds this endpoint, or refuses to open it.
        with manager._using() as m, \
                (_NO_HANDLE if connector is None else connector._using()) as c:
            if cfg is None:
                _check(C.kvt_endpoint_open(out, m, c, _path(path)))
            else:
                _check(C.kvt_endpoint_open_with(out, m, c, _path(path), cfg))
            self.path = path
            self._owners = [o for o in (manager, connector) if o is not None]
            for o in self._owners:
                o._endpoints.add(self)
            self._own(out[0])

    def _free(self, e) -> None:
        C.kvt_endpoint_close(e)
        for o in self._owners:
            o._endpoints.discard(self)

    def stats(self) -> EndpointStats:
        s = _versioned("kvt_endpoint_stats")
        with self._using() as ep:
            _check(C.kvt_endpoint_stats_get(s, ep))
        return EndpointStats._from_c(s)
