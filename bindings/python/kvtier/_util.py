"""What every object of the binding shares: arrays in and out, strings in, typed records
out, the lifecycle of a C handle, and waiting on a descriptor in asyncio."""
import array
import asyncio
import contextlib
import dataclasses
import functools
import os
import threading
from typing import ClassVar, Dict, Iterator, List, Optional, Tuple

from ._enums import _member
from ._errors import InvalidHandleError, _invalid
from ._ffi import ffi

# ---- arrays ----


def _c_array(values, ctype, typecodes, what):
    """(cdata ctype[], length) from a list of ints (copied), or from a buffer of unsigned
    integers of ctype's width (array, numpy, memoryview: passed without a copy)."""
    size = ffi.sizeof(ctype)
    if type(values) is array.array and values.typecode in typecodes and values.itemsize == size:
        return (ffi.from_buffer(ctype + "[]", values) if values else ffi.NULL), len(values)
    try:
        if isinstance(values, (list, tuple, range)):
            n = len(values)
            return (ffi.new(ctype + "[]", list(values)) if n else ffi.NULL), n
        mv = memoryview(values)
        if mv.itemsize != size or mv.format.lstrip("<=@") not in typecodes:
            mv = memoryview(array.array(typecodes[0], mv.tolist()))
    except (OverflowError, TypeError) as e:
        raise _invalid("%s must hold %s values: %s" % (what, ctype, e)) from None
    n = mv.nbytes // size
    return (ffi.from_buffer(ctype + "[]", mv) if n else ffi.NULL), n


def _u64_array(values, what="array"):
    return _c_array(values, "uint64_t", "QL", what)


def _u32_array(values, what="tokens"):
    return _c_array(values, "uint32_t", "I", what)


def _to_list(cdata, n) -> List[int]:
    return ffi.unpack(cdata, n) if n else []


_tls = threading.local()
_SCRATCH = 64


def _scratch():
    """Per-thread input and output arrays for small calls: allocating them per call would
    cost more than the call itself."""
    s = getattr(_tls, "s", None)
    if s is None:
        s = _tls.s = (ffi.new("uint64_t[]", _SCRATCH), ffi.new("uint64_t[]", _SCRATCH),
                      ffi.new("size_t *"))
    return s


def _path(value) -> bytes:
    """The bytes of a str, bytes or path for a C string: one with a NUL byte is refused, as C
    would read it cut there."""
    b = os.fsencode(value)
    if b"\0" in b:
        raise _invalid("%r holds a NUL byte" % (value,))
    return b


def _cstr(value, keep: list):
    """A NUL-terminated copy of a str, bytes or path for a C string the library borrows;
    NULL for None. The copy is appended to keep, which must outlive the call. A char array
    or pointer of the caller's (how 0.4 callers passed strings) is passed as it is, and
    must outlive the call too. TypeError for anything else."""
    if value is None:
        return ffi.NULL
    if isinstance(value, ffi.CData) and ffi.typeof(value).kind in ("array", "pointer") \
            and ffi.typeof(value).item.cname == "char":
        return value
    s = ffi.new("char[]", _path(value))
    keep.append(s)
    return s


def _versioned(ctype: str):
    """A new versioned struct (kvt_tier_stats, ...) with struct_size set, for the library to
    fill."""
    s = ffi.new(ctype + " *")
    s.struct_size = ffi.sizeof(ctype)
    return s


# ---- records: typed results that still read like the dicts of earlier versions ----

class _Record:
    """A dataclass of the same-named fields of a C struct. It also reads like the dict earlier
    versions returned: r["field"], "field" in r, iteration over the field names, dict(r)."""
    _ctype: ClassVar[str]
    _enums: ClassVar[Dict[str, type]] = {}

    @classmethod
    def _from_c(cls, s, **given):
        """cls from struct s: char arrays as str, other arrays as (nested) lists, the fields
        named in _enums as members of their enum; given overrides fields."""
        values = {}
        for name, kind in _plan(cls):
            if name in given:
                continue
            v = getattr(s, name)
            if kind == "str":
                v = ffi.string(v).decode(errors="replace")
            elif kind == "array":
                v = _nested(v)
            elif name in cls._enums:
                v = _member(cls._enums[name], v)
            values[name] = v
        return cls(**values, **given)

    def keys(self) -> List[str]:
        return [name for name, _ in _plan(type(self))]

    def __getitem__(self, name: str):
        if name not in self.keys():
            raise KeyError(name)
        return getattr(self, name)

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def __contains__(self, name) -> bool:
        return name in self.keys()

    def __len__(self) -> int:
        return len(self.keys())


@functools.lru_cache(maxsize=None)
def _plan(cls) -> Tuple[Tuple[str, str], ...]:
    """(field, "str" | "array" | "value") for each field of a _Record, from its C struct."""
    ctype = dict(ffi.typeof(cls._ctype).fields)
    out = []
    for f in dataclasses.fields(cls):
        t = ctype[f.name].type
        if t.kind == "array":
            out.append((f.name, "str" if t.item.cname == "char" else "array"))
        else:
            out.append((f.name, "value"))
    return tuple(out)


def _nested(a) -> list:
    """A C array as a list, an array of arrays (transitions[11][11]) as a list of lists."""
    if ffi.typeof(a).item.kind == "array":
        return [_nested(row) for row in a]
    return list(a)


# ---- handles ----

class _Gate:
    """The calls in flight on one handle. `with gate as h:` around each C call on the handle
    (handle._using()): it gives the handle, or raises the handle's closed error once close()
    has begun, and counts the call until it returns. close() shuts the gate (no call enters
    any more), waits until none is in flight, and only then frees the handle: the library
    destroys a handle "when no other call on it runs" (kvtier.h), and cffi lets the GIL go
    during each call. It holds no reference to its owner, so that dropping the owner still
    closes it at once.

    A call counts itself by appending to `calls` (list.append and list.pop are atomic), then
    looks at `shut`; close() sets `shut`, then waits, under `idle`, for `calls` to empty.
    Either the call sees `shut` and backs out, or close() sees the call. No lock on a call's
    path: one would cost about as much as a short C call (match_prefix)."""
    __slots__ = ("h", "calls", "shut", "idle", "owner")

    def __init__(self, handle, owner: type):
        self.h, self.calls, self.shut, self.owner = handle, [], False, owner
        self.idle = threading.Condition(threading.Lock())  # the last call out notifies

    def __enter__(self):
        self.calls.append(None)
        if self.shut:
            self.__exit__()
            raise self.closed_error()
        return self.h

    def __exit__(self, *exc) -> None:
        self.calls.pop()
        if self.shut:
            self.wake()

    def closed_error(self) -> Exception:
        o = self.owner
        return o._closed_error(o._closed_message, o._closed_error.status)

    def wake(self) -> None:
        """close() waits: tell it (under the lock, so that it cannot miss it)."""
        with self.idle:
            self.idle.notify_all()

    def close(self, wait: bool) -> bool:
        """Shuts the gate; then, with wait, returns once no call is in flight (True); without,
        False at once if calls are in flight."""
        self.shut = True
        with self.idle:
            if self.calls and not wait:
                return False
            self.idle.wait_for(lambda: not self.calls)
        return True


_NO_HANDLE = contextlib.nullcontext(ffi.NULL)  # `with` in an absent handle's place: NULL


class _Handle:
    """The lifecycle of an object owning a C handle. Each C call on the handle runs inside
    `with self._using() as h:`, which gives the handle or raises _closed_error; close() frees
    the handle once (thread-safe, idempotent), also on leaving a with block and at garbage
    collection, after the calls that other threads have in flight on it returned (new ones
    fail from the moment close() begins). A subclass calls _own(handle) in __init__, frees in
    _free(handle), closes what must go first (transfers, a connector) in _close_first(), and
    ends its blocking calls in _let_go(). _live() gives the handle without counting a call:
    for handles that guard their calls otherwise (transfers, fences: tokens)."""
    _h = None
    _gate: Optional[_Gate] = None
    _closed_error: ClassVar[type] = InvalidHandleError
    _closed_message: ClassVar[str] = "the handle is closed"

    def _own(self, handle, lock=None) -> None:
        self._closing = lock or threading.Lock()
        self._gate = _Gate(handle, type(self))
        self._h = handle

    def _using(self) -> _Gate:
        """`with self._using() as h:` around a C call on h (see _Gate)."""
        g = self._gate
        if g is None:  # __init__ failed before _own
            raise self._closed_error(self._closed_message, self._closed_error.status)
        return g

    def _live(self):
        h = self._h
        if h is None or self._gate.shut or self._parent_closed():
            raise self._closed_error(self._closed_message, self._closed_error.status)
        return h

    def _parent_closed(self) -> bool:
        return False

    def _close_first(self) -> None:
        pass

    def _let_go(self, handle) -> None:
        """Ends what would keep a call in flight waiting (the gate is shut by now)."""

    def _free(self, handle) -> None:
        raise NotImplementedError

    @property
    def closed(self) -> bool:
        return self._h is None

    def close(self) -> None:
        self._close(wait=True)

    def _close(self, wait: bool) -> None:
        if self._h is None:  # also when __init__ failed before _own
            return
        with self._closing:
            if self._h is None:
                return
            g = self._gate
            g.shut = True  # from here on, calls fail with _closed_error
            self._close_first()
            self._let_go(self._h)
            if not g.close(wait):
                return  # a finalizer does not wait; unreachable: a call holds a reference
            self._close_first()  # what a call that was in flight created meanwhile
            h, self._h = self._h, None
            g.h = None
            self._free(h)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self._close(wait=False)
        except Exception:  # nothing to raise to at collection or interpreter exit
            pass


# ---- asyncio ----

async def _readable(fd: int, timeout: Optional[float] = None) -> None:
    """Returns once fd is readable, without blocking the running loop (loop.add_reader)."""
    loop = asyncio.get_running_loop()
    ready = loop.create_future()
    loop.add_reader(fd, lambda: ready.done() or ready.set_result(None))
    try:
        await asyncio.wait_for(ready, timeout)
    finally:
        loop.remove_reader(fd)

