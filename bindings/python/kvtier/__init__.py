"""kvtier: a tiered KV-cache block manager, from Python (cffi, ABI mode).

    import kvtier
    with kvtier.Manager(page_size=16, g1_blocks=4096, g2_blocks=16384) as m:
        hashes = kvtier.hash_sequence(tokens, page_size=16, salt=b"llama-3-8b")
        hits = m.match_prefix(hashes)                 # pinned G1 blocks
        new = m.alloc(len(hashes) - len(hits))
        ...                                           # fill m.block_data(b)
        new = m.register_hashes(new, hashes[len(hits):], parent=hashes[len(hits) - 1] if hits else 0)
        with m.offload(new, kvtier.G2) as x:
            x.wait()
        m.release(hits + new)

Arrays in: lists of ints, or any buffer of uint64 (array('Q'), numpy uint64, memoryview),
passed without a copy. Arrays out: lists of ints. Every error is a kvtier.Error subclass with .status and the
library's message; kvtier.CancelledError marks a cancelled transfer.

Manager(**config) takes every field of kvt_manager_config by name, G1Layout engine-owned G1
memory (any writable buffer, or an (address, length) pair), and set_log_handler sends the
library's diagnostics to a logging.Logger or a callable.

Connector(manager, **config) is the request layer (kvt_connector_*) with vLLM's method names
(see kvtier/connector.py); kvtier.vllm plugs it into vLLM by module path.
"""
import array
import asyncio
import atexit
import builtins
import collections
import logging
import os
import threading

from ._ffi import C, CONST, ffi

__all__ = [
    "G1", "G2", "G3", "Manager", "Transfer", "Fence", "Seq", "Event", "Error",
    "InvalidArgumentError", "InvalidHandleError", "StateError", "NoSpaceError",
    "CancelledError", "UnsupportedError", "IoError", "CorruptError", "NoMemoryError",
    "CudaError", "InternalError", "TimeoutError", "hash_salt", "hash_sequence", "version",
    "G1Layout", "Policy", "set_log_handler", "NotFoundError", "Connector", "ScheduledRequest",
    "Finished", "slot_state_str", "EVICT_LRU", "EVICT_S3FIFO", "Subscription", "EventLog",
]

G1, G2, G3 = C.KVT_TIER_G1, C.KVT_TIER_G2, C.KVT_TIER_G3
OK = CONST["KVT_OK"]


IO_AUTO, IO_URING, IO_THREADS = C.KVT_IO_AUTO, C.KVT_IO_URING, C.KVT_IO_THREADS
CUDA_COPY_BATCHED, CUDA_COPY_PER_CHUNK = C.KVT_CUDA_COPY_BATCHED, C.KVT_CUDA_COPY_PER_CHUNK
CUDA_COPY_KERNEL, CUDA_COPY_AUTO = C.KVT_CUDA_COPY_KERNEL, C.KVT_CUDA_COPY_AUTO
G3_FAULT_OFF, G3_FAULT_WRITE, G3_FAULT_READ = (
    C.KVT_G3_FAULT_OFF, C.KVT_G3_FAULT_WRITE, C.KVT_G3_FAULT_READ)
LOG_OFF, LOG_ERROR, LOG_WARN, LOG_INFO, LOG_DEBUG = (
    C.KVT_LOG_OFF, C.KVT_LOG_ERROR, C.KVT_LOG_WARN, C.KVT_LOG_INFO, C.KVT_LOG_DEBUG)


def version():
    return ffi.string(C.kvt_version()).decode()


# ---- diagnostics ----

_LOGGING_LEVELS = {LOG_ERROR: logging.ERROR, LOG_WARN: logging.WARNING, LOG_INFO: logging.INFO,
                   LOG_DEBUG: logging.DEBUG}
_log_handler = None


@ffi.callback("kvt_log_fn")
def _log_callback(level, message, _user_data):
    """The one callback the library holds: a replaced handler is never called after."""
    handler = _log_handler
    if handler is not None:
        handler(level, ffi.string(message).decode(errors="replace"))


def set_log_handler(handler, level=LOG_WARN):
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


# ---- errors: one class per status, all under Error ----

class Error(Exception):
    """A kvtier failure: .status is the kvt_status, .message the library's explanation."""
    status = None

    def __init__(self, message, status=None):
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
IoError = _error_class("IoError", "KVT_ERR_IO", "G3 I/O failed")
CorruptError = _error_class("CorruptError", "KVT_ERR_CORRUPT", "checksum or hash mismatch")
NoMemoryError = _error_class("NoMemoryError", "KVT_ERR_NO_MEMORY", "out of memory")
CudaError = _error_class("CudaError", "KVT_ERR_CUDA", "a CUDA call failed")
NotFoundError = _error_class("NotFoundError", "KVT_ERR_NOT_FOUND",
                             "an unknown request id (never seen, or finished)")
InternalError = _error_class("InternalError", "KVT_ERR_INTERNAL", "a bug in kvtier")


class TimeoutError(Error, builtins.TimeoutError):
    """A wait ran out of time (KVT_TIMEOUT)."""
    status = CONST["KVT_TIMEOUT"]


_BY_STATUS = {c.status: c for c in (
    InvalidArgumentError, InvalidHandleError, StateError, NoSpaceError, CancelledError,
    UnsupportedError, IoError, CorruptError, NoMemoryError, CudaError, NotFoundError,
    InternalError, TimeoutError)}


def _raise(status):
    msg = ffi.string(C.kvt_last_error()).decode(errors="replace")
    cls = _BY_STATUS.get(status, Error)
    raise cls(msg or ffi.string(C.kvt_status_str(status)).decode(), status)


def _check(status):
    if status != OK:
        _raise(status)


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
        raise InvalidArgumentError("%s must hold %s values: %s" % (what, ctype, e),
                                   CONST["KVT_ERR_INVALID_ARGUMENT"]) from None
    n = mv.nbytes // size
    return (ffi.from_buffer(ctype + "[]", mv) if n else ffi.NULL), n


def _u64_array(values, what="array"):
    return _c_array(values, "uint64_t", "QL", what)


def _u32_array(values, what="tokens"):
    return _c_array(values, "uint32_t", "I", what)


def _to_list(cdata, n):
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


# ---- hashing ----

def hash_salt(salt=b""):
    if isinstance(salt, str):
        salt = salt.encode()
    out = ffi.new("uint64_t *")
    _check(C.kvt_hash_salt(out, salt, len(salt)))
    return out[0]


def hash_sequence(tokens, page_size, salt=b""):
    """Sequence hashes of the full blocks of tokens, as a list."""
    toks, n = _u32_array(tokens)
    salt_hash = salt if isinstance(salt, int) else hash_salt(salt)
    need = ffi.new("size_t *")
    cap = n // page_size if page_size > 0 else 0
    out = ffi.new("uint64_t[]", max(cap, 1))
    _check(C.kvt_hash_sequence(out, need, cap, salt_hash, toks, n, page_size))
    return _to_list(out, need[0])


class Seq:
    """Incremental hasher: append tokens in any split; hashes() equals hash_sequence."""

    def __init__(self, page_size, salt=b""):
        out = ffi.new("kvt_seq **")
        salt_hash = salt if isinstance(salt, int) else hash_salt(salt)
        _check(C.kvt_seq_create(out, salt_hash, page_size))
        self._s = out[0]

    def append(self, tokens):
        toks, n = _u32_array(tokens)
        _check(C.kvt_seq_append(self._live(), toks, n))

    def hashes(self, first=0):
        """The sequence hashes of the complete blocks from block `first` on."""
        t, b = ffi.new("size_t *"), ffi.new("size_t *")
        _check(C.kvt_seq_info(t, b, self._live()))
        n = max(b[0] - first, 0)
        out, got = ffi.new("uint64_t[]", max(n, 1)), ffi.new("size_t *")
        _check(C.kvt_seq_hashes(got, ffi.NULL, out, self._s, first, n))
        return _to_list(out, got[0])

    def _live(self):
        if self._s is None:
            raise InvalidHandleError("kvt_seq is closed", CONST["KVT_ERR_INVALID_HANDLE"])
        return self._s

    def close(self):
        if self._s is not None:
            C.kvt_seq_destroy(self._s)
            self._s = None

    __del__ = close

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# ---- events ----

Event = collections.namedtuple("Event", "type status tier user_data hash parent_hash count")

_OBS_FIELDS = ("seq", "time_ns", "state", "prev", "trigger", "src", "dst", "status", "batch",
               "hash", "parent_hash", "tokens", "computed", "blocks", "bytes", "duration_ns",
               "count")


def _obs_event(e):
    """A kvt_obs_event as a dict (docs/EVENTS.md), its kind by name."""
    d = {f: getattr(e, f) for f in _OBS_FIELDS}
    d["kind"] = ffi.string(C.kvt_obs_kind_str(e.kind)).decode()
    d["req_id"] = ffi.string(e.req_id).decode("utf-8", "replace")
    return d


class Subscription:
    """A reader of a manager's observe events (kvt_subscription_create) with a queue of `capacity`:
    drain() returns the queued events as dicts, oldest first (a DROPPED event first when
    the queue overflowed); fileno() is readable while events are queued."""

    def __init__(self, manager, capacity):
        out = ffi.new("kvt_subscription **")
        _check(C.kvt_subscription_create(out, manager._live(), capacity))
        self._s = out[0]

    def _live(self):
        if self._s is None:
            raise StateError("the subscription is closed", CONST["KVT_ERR_STATE"])
        return self._s

    def drain(self, max_events=1024):
        buf = ffi.new("kvt_obs_event[]", max_events)
        n = C.kvt_subscription_drain(self._live(), buf, max_events)
        return [_obs_event(e) for e in buf[0:n]]

    def fileno(self):
        return C.kvt_subscription_fd(self._live())

    def close(self):
        if self._s is not None:
            C.kvt_subscription_destroy(self._s)
            self._s = None

    def __del__(self):
        self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class EventLog:
    """Iterates the records of an event log (kvt_manager_recorder_open, kvtier-replay --record) as
    dicts. A torn tail ends the iteration; `torn` then says so and `why` where."""

    def __init__(self, path):
        out = ffi.new("kvt_event_log **")
        _check(C.kvt_event_log_open(out, os.fsencode(path)))
        self._l = ffi.gc(out[0], C.kvt_event_log_close)
        self.torn, self.why = False, ""

    def __iter__(self):
        e = ffi.new("kvt_obs_event *")
        while True:
            st = C.kvt_event_log_next(self._l, e)
            if st == CONST["KVT_ERR_NOT_FOUND"]:
                return
            if st == CONST["KVT_ERR_CORRUPT"]:
                self.torn, self.why = True, ffi.string(C.kvt_last_error()).decode()
                return
            _check(st)
            yield _obs_event(e)
XFER_DONE, BLOCK_STORED, BLOCK_REMOVED, EVENTS_DROPPED, TIER_CLEARED = (
    C.KVT_EVENT_XFER_DONE, C.KVT_EVENT_BLOCK_STORED, C.KVT_EVENT_BLOCK_REMOVED,
    C.KVT_EVENT_EVENTS_DROPPED, C.KVT_EVENT_TIER_CLEARED)


# ---- manager ----

def _fields(struct):
    """A filled stats struct as a dict of its fields, struct_size and reserved left out."""
    return {k: getattr(struct, k) for k, _ in ffi.typeof(struct).item.fields
            if k not in ("struct_size", "reserved")}


class Policy(collections.namedtuple("Policy", "flags min_frequency", defaults=(1,))):
    """An offload filter (kvt_policy): flags of POLICY_PRESENCE and POLICY_FREQUENCY."""


POLICY_PASS_ALL, POLICY_PRESENCE, POLICY_FREQUENCY = (
    CONST["KVT_POLICY_PASS_ALL"], CONST["KVT_POLICY_PRESENCE"], CONST["KVT_POLICY_FREQUENCY"])
MEMORY_AUTO, MEMORY_HOST, MEMORY_CUDA = C.KVT_MEMORY_AUTO, C.KVT_MEMORY_HOST, C.KVT_MEMORY_CUDA
EVICT_LRU, EVICT_S3FIFO = C.KVT_EVICT_LRU, C.KVT_EVICT_S3FIFO  # config eviction=[G1, G2, G3]


def _invalid(message):
    return InvalidArgumentError(message, CONST["KVT_ERR_INVALID_ARGUMENT"])


class G1Layout:
    """Engine-owned G1 memory (kvt_g1_layout): chunk (layer, outer) of slot b lives at
    bases[layer * num_outer + outer] + b * strides[same index].

    Each base is an object with the buffer protocol (bytearray, writable memoryview, mmap,
    array, numpy array: kvtier writes into it when it onboards), or an (address, length)
    pair of ints for memory Python does not own (CUDA memory, for instance). The manager
    checks that each buffer holds every slot, and keeps the buffers alive until it closes."""

    def __init__(self, bases, strides, memory=C.KVT_MEMORY_HOST, cuda_device=0):
        if len(bases) != len(strides):
            raise _invalid("g1_layout: %d bases but %d strides" % (len(bases), len(strides)))
        self.bases, self.strides = list(bases), list(strides)
        self.memory, self.cuda_device = memory, cuda_device

    def _cdata(self, cfg):
        """(kvt_g1_layout *, the cdata objects that must outlive the manager)."""
        n = cfg.num_layers * cfg.num_outer
        if len(self.bases) != n:
            raise _invalid("g1_layout: %d bases for num_layers * num_outer = %d"
                           % (len(self.bases), n))
        keep, pointers = [], []
        for i, (base, stride) in enumerate(zip(self.bases, self.strides)):
            if isinstance(base, tuple):
                address, length = base
                p = ffi.cast("void *", address)
            else:
                try:
                    p = ffi.from_buffer(base, require_writable=True)
                except (TypeError, BufferError) as e:
                    raise _invalid("g1_layout base %d: %s" % (i, e)) from None
                length = len(p)
            need = (cfg.g1_blocks - 1) * stride + cfg.chunk_bytes if cfg.g1_blocks else 0
            if stride < 0 or length < need:
                raise _invalid("g1_layout base %d: %d bytes, but %d slots of stride %d need %d"
                               % (i, length, cfg.g1_blocks, stride, need))
            keep.append(p)
            pointers.append(p)
        layout = ffi.new("kvt_g1_layout *")
        layout.struct_size = ffi.sizeof("kvt_g1_layout")
        layout.memory, layout.cuda_device = self.memory, self.cuda_device
        bases = ffi.new("void *[]", pointers)
        strides = ffi.new("uint64_t[]", self.strides)
        layout.bases, layout.strides = bases, strides
        return layout, keep + [layout, bases, strides]


def _config(g3_path, g1_layout, fields):
    """A kvt_manager_config: the library's defaults, G1 in host memory, then fields by name
    (every field of the struct; policies as Policy, a (flags, min_frequency) pair or a
    dict). Returns it with the cdata objects that must outlive the manager."""
    cfg = ffi.new("kvt_manager_config *")
    C.kvt_manager_config_init_sized(cfg, ffi.sizeof("kvt_manager_config"))
    cfg.g1_memory = C.KVT_MEMORY_HOST
    for k, v in fields.items():
        if k in ("struct_size", "g3_path", "g1_layout") or k not in _CONFIG_FIELDS:
            raise _invalid("unknown config field %r" % k)
        try:
            if k in _POLICY_FIELDS:
                v = Policy(**v) if isinstance(v, dict) else Policy(*v)
                v = {"flags": v.flags, "min_frequency": v.min_frequency}
            setattr(cfg, k, v)
        except (OverflowError, TypeError) as e:
            raise _invalid("config %s: %s" % (k, e)) from None
    keep = [cfg]
    if g3_path is not None:
        path = ffi.new("char[]", os.fsencode(g3_path))
        cfg.g3_path = path
        keep.append(path)
    if g1_layout is not None:
        layout, held = g1_layout._cdata(cfg)
        cfg.g1_layout = layout
        keep += held
    return cfg, keep


_CONFIG_FIELDS = frozenset(name for name, _ in ffi.typeof("kvt_manager_config").fields)
_POLICY_FIELDS = frozenset(name for name, f in ffi.typeof("kvt_manager_config").fields
                           if f.type is ffi.typeof("kvt_policy"))


class Manager:
    """Owns a kvt_manager. Use as a context manager, or call close(). Calls from several
    threads at once are fine: the library is thread-safe and cffi releases the GIL."""

    def __init__(self, g3_path=None, g1_layout=None, **config):
        """config: any field of kvt_manager_config by name (page_size=16, g2_blocks=0,
        policy_g1_g2=Policy(POLICY_FREQUENCY, 2), g3_io=IO_THREADS, ...); the others keep the
        library's defaults, except g1_memory, which defaults to host memory. g1_layout: a
        G1Layout for engine-owned G1 memory."""
        cfg, keep = _config(g3_path, g1_layout, config)
        out = ffi.new("kvt_manager **")
        _check(C.kvt_manager_create(out, cfg))
        self._m = out[0]
        self._keep = keep  # G1's buffers among them: the library uses them until close
        self._lock = threading.Lock()  # guards close() against itself only
        self._transfers = set()
        self._shape = (cfg.num_layers, cfg.num_outer, cfg.chunk_bytes)  # for a connector's G1
        self._connector = None  # at most one (kvt_connector_create): closed before the manager

    # lifetime
    def _live(self):
        m = self._m
        if m is None:
            raise InvalidHandleError("the manager is closed", CONST["KVT_ERR_INVALID_HANDLE"])
        return m

    def close(self):
        with self._lock:
            if self._m is None:
                return
            for x in list(self._transfers):  # cancels them, and waits for their waiters
                x.close()
            if self._connector is not None:
                self._connector.close()
            C.kvt_manager_destroy(self._m)
            self._m = None
            self._keep = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def closed(self):
        return self._m is None

    # blocks
    def alloc(self, n, tier=G1):
        out = ffi.new("kvt_block[]", max(n, 1))
        _check(C.kvt_block_alloc(out, n, self._live(), tier))
        return _to_list(out, n)

    def release(self, blocks):
        arr, n = _u64_array(blocks, "blocks")
        _check(C.kvt_block_release(self._live(), arr, n))

    def retain(self, block):
        _check(C.kvt_block_retain(self._live(), block))

    # priorities and pins: what eviction spares
    def set_priority(self, blocks, priority):
        """Eviction priority of registered blocks, all or none: lower is evicted first (0 by
        default), the tier's policy orders equals."""
        if not -2**31 <= priority < 2**31:
            raise _invalid("priority %d is not a 32-bit integer" % priority)
        arr, n = _u64_array(blocks, "blocks")
        _check(C.kvt_block_set_priority(self._live(), arr, n, priority))

    def pin(self, blocks):
        """Registered blocks that eviction never takes, all or none: NoSpaceError past the
        tier's max_pinned_percent."""
        arr, n = _u64_array(blocks, "blocks")
        _check(C.kvt_block_pin(self._live(), arr, n))

    def unpin(self, blocks):
        arr, n = _u64_array(blocks, "blocks")
        _check(C.kvt_block_unpin(self._live(), arr, n))

    def evictable(self, max_blocks=None, tier=G1):
        """The inactive blocks in the order the tier would evict them."""
        n = self.tier_stats(tier)["capacity"] if max_blocks is None else max_blocks
        out = ffi.new("kvt_block[]", max(n, 1))
        got = ffi.new("size_t *")
        _check(C.kvt_tier_evictable(got, out, n, self._live(), tier))
        return _to_list(out, got[0])

    def register_hash(self, block, seq_hash, parent=0):
        out = ffi.new("kvt_block *")
        _check(C.kvt_block_register_hash(out, self._live(), block, seq_hash, parent))
        return out[0]

    def register_hashes(self, blocks, seq_hashes, parent=0):
        b, n = _u64_array(blocks, "blocks")
        h, nh = _u64_array(seq_hashes, "seq_hashes")
        if n != nh:
            raise InvalidArgumentError("%d blocks but %d hashes" % (n, nh),
                                       CONST["KVT_ERR_INVALID_ARGUMENT"])
        out = ffi.new("kvt_block[]", max(n, 1))
        _check(C.kvt_block_register_hashes(out, self._live(), b, h, n, parent))
        return _to_list(out, n)

    def match_prefix(self, seq_hashes, tier=G1):
        """The pinned blocks of the longest registered prefix, as a list."""
        m = self._m or self._live()
        if type(seq_hashes) is list and len(seq_hashes) <= _SCRATCH:
            h, out, got = _scratch()
            n = len(seq_hashes)
            try:
                h[0:n] = seq_hashes
            except (OverflowError, TypeError) as e:
                raise InvalidArgumentError("seq_hashes: %s" % e,
                                           CONST["KVT_ERR_INVALID_ARGUMENT"]) from None
        else:
            h, n = _u64_array(seq_hashes, "seq_hashes")
            out, got = ffi.new("kvt_block[]", max(n, 1)), ffi.new("size_t *")
        st = C.kvt_tier_match_prefix(got, out, m, tier, h, n)
        if st:
            _raise(st)
        return ffi.unpack(out, got[0])

    def block_data(self, block):
        """A writable memoryview of the block's bytes, valid while a reference is held."""
        p, n = ffi.new("void **"), ffi.new("size_t *")
        _check(C.kvt_block_data(p, n, self._live(), block))
        return memoryview(ffi.buffer(p[0], n[0])) if n[0] else memoryview(b"")

    def block_info(self, block):
        info = ffi.new("kvt_block_info *")
        info.struct_size = ffi.sizeof("kvt_block_info")
        _check(C.kvt_block_info_get(info, self._live(), block))
        return {k: getattr(info, k) for k in ("state", "tier", "refs", "tokens", "seq_hash",
                                               "parent_hash")}

    def block_chunk(self, block, layer, outer):
        """The address of chunk (layer, outer) of a block, as an int (a device address for
        CUDA memory); chunk_bytes long, valid while a reference to the block is held."""
        p = ffi.new("void **")
        _check(C.kvt_block_chunk(p, self._live(), block, layer, outer))
        return int(ffi.cast("uintptr_t", p[0]))

    def tier_stats(self, tier=G1):
        s = ffi.new("kvt_tier_stats *")
        s.struct_size = ffi.sizeof("kvt_tier_stats")
        _check(C.kvt_tier_stats_get(s, self._live(), tier))
        return _fields(s)

    def transfer_stats(self, src, dst):
        """The counters of one direction (G1 -> G2, ..., G3 -> G1) since creation."""
        s = ffi.new("kvt_transfer_stats *")
        s.struct_size = ffi.sizeof("kvt_transfer_stats")
        _check(C.kvt_transfer_stats_get(s, self._live(), src, dst))
        return _fields(s)

    def check(self):
        _check(C.kvt_manager_check(self._live()))

    # observe (docs/EVENTS.md)
    def subscribe(self, capacity=65536):
        return Subscription(self, capacity)

    def record(self, path):
        """Appends every event from now on to a new event log at path."""
        _check(C.kvt_manager_recorder_open(self._live(), os.fsencode(path)))

    def stop_recording(self):
        _check(C.kvt_manager_recorder_close(self._live()))

    def metrics_text(self, connector=None):
        """Prometheus text of the counters (and of the connector's slots, when given)."""
        c = connector._c if connector is not None else ffi.NULL
        n = ffi.new("size_t *")
        C.kvt_metrics_text(ffi.NULL, 0, n, self._live(), c)
        buf = ffi.new("char[]", n[0] + 4096)
        _check(C.kvt_metrics_text(buf, len(buf), n, self._live(), c))
        return ffi.string(buf, n[0]).decode()

    def tier_hashes(self, tier=G1):
        """The hashes the tier holds registered now."""
        n = ffi.new("size_t *")
        _check(C.kvt_tier_hashes(ffi.NULL, 0, n, self._live(), tier))
        buf = ffi.new("uint64_t[]", n[0])
        _check(C.kvt_tier_hashes(buf, n[0], n, self._live(), tier))
        return list(buf[0:min(n[0], len(buf))])

    def reset(self, tier=0):
        """Empties one tier's registry, or every tier's (0): transfers not yet committed that
        touch it end cancelled, copies in flight are waited for; blocks still held stay
        readable until released. Events: BLOCK_REMOVED per block, then TIER_CLEARED."""
        _check(C.kvt_manager_reset(self._live(), tier))

    # transfers
    def offload(self, blocks, dst, fence=None, user_data=0):
        b, n = _u64_array(blocks, "blocks")
        out = ffi.new("kvt_xfer **")
        _check(C.kvt_xfer_offload(out, self._live(), b, n, dst, self._fence(fence), user_data))
        return Transfer(self, out[0], n)

    def onboard(self, src, dst_g1, fence=None, user_data=0):
        s, n = _u64_array(src, "src")
        d, nd = _u64_array(dst_g1, "dst_g1")
        if n != nd:
            raise InvalidArgumentError("%d sources but %d destinations" % (n, nd),
                                       CONST["KVT_ERR_INVALID_ARGUMENT"])
        out = ffi.new("kvt_xfer **")
        _check(C.kvt_xfer_onboard(out, self._live(), s, d, n, self._fence(fence), user_data))
        return Transfer(self, out[0], n)

    def fence(self):
        out = ffi.new("kvt_fence **")
        _check(C.kvt_fence_create(out, self._live()))
        return Fence(self, out[0])

    def _fence(self, fence):
        if fence is None:
            return ffi.NULL
        if not isinstance(fence, Fence):
            raise InvalidArgumentError("fence must be a kvtier.Fence, not %s"
                                       % type(fence).__name__, CONST["KVT_ERR_INVALID_ARGUMENT"])
        return fence._live()

    # events
    def poll(self, max_events=256):
        buf = ffi.new("kvt_event[]", max_events)
        n = C.kvt_manager_poll(self._live(), buf, max_events)
        return [Event(e.type, e.status, e.tier, e.user_data, e.hash, e.parent_hash, e.count)
                for e in buf[0:n]]

    def events(self):
        """Drains the pending events, oldest first."""
        while True:
            batch = self.poll()
            if not batch:
                return
            yield from batch

    def fileno(self):
        """The event fd: readable while events are pending (select, poll, asyncio)."""
        return C.kvt_manager_event_fd(self._live())

    async def next_events(self):
        """Waits on the event fd in the running asyncio loop, then drains the events."""
        loop = asyncio.get_running_loop()
        while True:
            batch = self.poll()
            if batch:
                return batch
            ready = loop.create_future()
            fd = self.fileno()
            loop.add_reader(fd, lambda: ready.done() or ready.set_result(None))
            try:
                await ready
            finally:
                loop.remove_reader(fd)


class Transfer:
    """An enqueued offload or onboard. wait() raises CancelledError for a cancelled one.
    close() (or leaving a with block) releases it; one not yet committed is cancelled.
    Any thread may close it while others wait(): their waits return, the transfer's
    cancellation or final outcome, before close() releases the C object."""

    def __init__(self, manager, x, n):
        self._m, self._x, self._n = manager, x, n
        self._cv = threading.Condition()  # guards _x and _waiters
        self._waiters = 0
        manager._transfers.add(self)

    def _live(self):
        if self._x is None or self._m.closed:
            raise InvalidHandleError("the transfer is released or its manager closed",
                                     CONST["KVT_ERR_INVALID_HANDLE"])
        return self._x

    def cancel(self):
        with self._cv:
            _check(C.kvt_xfer_cancel(self._live()))

    def wait(self, timeout=None):
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

    def done(self):
        with self._cv:
            return C.kvt_xfer_wait(self._live(), 0) != CONST["KVT_TIMEOUT"]

    @property
    def state(self):
        s = ffi.new("uint32_t *")
        with self._cv:
            _check(C.kvt_xfer_status(s, ffi.NULL, ffi.NULL, self._live()))
        return s[0]

    @property
    def count(self):
        c = ffi.new("uint64_t *")
        with self._cv:
            _check(C.kvt_xfer_status(ffi.NULL, ffi.NULL, c, self._live()))
        return c[0]

    def blocks(self):
        """After an onboard: the final G1 handles (dedup may swap some)."""
        out = ffi.new("kvt_block[]", max(self._n, 1))
        with self._cv:
            _check(C.kvt_xfer_blocks(out, self._n, self._live()))
        return _to_list(out, self._n)

    async def wait_async(self, poll_interval=0.001):
        """Waits without blocking the event loop."""
        while not self.done():
            await asyncio.sleep(poll_interval)
        return self.wait(0)

    def close(self):
        """Releases the transfer. Waits in other threads end first: a transfer not yet
        committed is cancelled at once, one in flight finishes its copy."""
        with self._cv:
            x, self._x = self._x, None
            if x is not None and not self._m.closed:
                if self._waiters:
                    C.kvt_xfer_cancel(x)
                    self._cv.wait_for(lambda: self._waiters == 0)
                C.kvt_xfer_release(x)
        self._m._transfers.discard(self)

    release = close

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Fence:
    """A precondition the host signals. close() destroys it; transfers still waiting on an
    unsignalled fence end cancelled."""

    def __init__(self, manager, f):
        self._m, self._f = manager, f

    def _live(self):
        if self._f is None or self._m.closed:
            raise InvalidHandleError("the fence is closed or its manager closed",
                                     CONST["KVT_ERR_INVALID_HANDLE"])
        return self._f

    def signal(self):
        _check(C.kvt_fence_signal(self._live()))

    def close(self):
        if self._f is not None and not self._m.closed:
            C.kvt_fence_destroy(self._f)
        self._f = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


from .connector import (  # noqa: E402,F401 (it builds on the classes above; re-exported)
    BLOCK_ID_NONE, OFFLOAD_EAGER, OFFLOAD_LAZY, ROLE_BOTH, ROLE_SCHEDULER, ROLE_WORKER,
    SLOT_DECODING, SLOT_FINISHED, SLOT_FINISHING, SLOT_INITIALIZED, SLOT_ONBOARD_STAGED,
    SLOT_ONBOARDING, SLOT_PREEMPTED, SLOT_PREFILLING, SLOT_SKIPPED_DECODE,
    SLOT_SKIPPED_PREFILL, Connector, Finished, ScheduledRequest, slot_state_str)
