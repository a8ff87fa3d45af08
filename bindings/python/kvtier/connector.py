"""The connector (kvt_connector_*): the request layer a serving engine plugs in, with the
method names of vLLM's KVConnectorBase_V1.

    with kvtier.Manager(page_size=16, num_layers=2, num_outer=2, chunk_bytes=256,
                        g2_blocks=50) as m, kvtier.Connector(m, num_gpu_blocks=100) as c:
        c.register_kv_caches(kvtier.G1Layout(bases, strides), 100)     # worker half
        n, is_async = c.get_num_new_matched_tokens("A", tokens)        # scheduler half
        c.update_state_after_alloc("A", [1, 2, 3], n)
        meta = c.build_connector_meta([kvtier.ScheduledRequest("A", n, len(tokens) - n)])
        c.bind_connector_metadata(meta)                                 # bytes: may cross
        ...                                                             # a process boundary
        done = c.get_finished()
        c.update_connector_output(done.report)

Request ids are str (or bytes); token and block ids lists of ints or uint32 buffers;
metadata and reports are bytes in and out. Errors are kvtier.Error subclasses carrying the
status and kvt_last_error(), as everywhere in the binding.
"""
import collections
import dataclasses
import threading
import time
import types
from typing import Callable, List, Optional, Tuple, Union

from ._config import ConnectorConfig, _merged
from ._enums import (OFFLOAD_EAGER, OFFLOAD_LAZY, ROLE_BOTH, ROLE_SCHEDULER, ROLE_WORKER,
                     SLOT_DECODING, SLOT_FINISHED, SLOT_FINISHING, SLOT_INITIALIZED,
                     SLOT_ONBOARD_STAGED, SLOT_ONBOARDING, SLOT_PREEMPTED, SLOT_PREFILLING,
                     SLOT_SKIPPED_DECODE, SLOT_SKIPPED_PREFILL, ObsTrigger, SlotState, Tier,
                     _member)
from ._errors import OK, TIMEOUT, TimeoutError, _call, _check, _invalid
from ._ffi import C, CONST, ffi
from ._manager import Event
from ._observe import LogReplay, _replayed
from ._util import _Handle, _Record, _u32_array, _versioned

__all__ = ["Connector", "ConnectorConfig", "ScheduledRequest", "Finished", "ConnectorStats",
           "SlotInfo", "BatchInfo", "PauseInfo", "Event", "slot_state_str", "BLOCK_ID_NONE",
           "SLOT_STATES", "ROLE_SCHEDULER", "ROLE_WORKER", "ROLE_BOTH", "OFFLOAD_EAGER",
           "OFFLOAD_LAZY", "SLOT_INITIALIZED", "SLOT_ONBOARD_STAGED", "SLOT_ONBOARDING",
           "SLOT_PREFILLING", "SLOT_DECODING", "SLOT_SKIPPED_PREFILL", "SLOT_SKIPPED_DECODE",
           "SLOT_PREEMPTED", "SLOT_FINISHING", "SLOT_FINISHED"]

BLOCK_ID_NONE = CONST["KVT_BLOCK_ID_NONE"]  # a sliding window's null block
SLOT_STATES = tuple(SlotState)
ReqId = Union[str, bytes]


def slot_state_str(state: int) -> str:
    """The name of a slot state, e.g. "KVT_SLOT_DECODING" (kvt_slot_state_str)."""
    return ffi.string(C.kvt_slot_state_str(state)).decode()


class ScheduledRequest(collections.namedtuple(
        "ScheduledRequest",
        "req_id num_computed_tokens num_scheduled_tokens new_block_ids new_token_ids",
        defaults=((), ()))):
    """One request in a step's schedule (kvt_scheduled_request): new_block_ids are the G1
    blocks added since the connector last saw its list, new_token_ids the tokens sampled
    since the last step."""


class Finished(collections.namedtuple(
        "Finished", "finished_sending finished_recving load_error_block_ids report")):
    """What the worker finished since its last get_finished (kvt_finished): two lists of
    request ids, the G1 blocks whose load failed, and the report (bytes) for the
    scheduler's update_connector_output."""


@dataclasses.dataclass(frozen=True)
class ConnectorStats(_Record):
    """The scheduler half's counters (kvt_connector_stats); transitions is an 11 x 11 list
    of lists indexed [from][to] by slot state (from 0: slot created)."""
    _ctype = "kvt_connector_stats"

    transitions: List[List[int]]
    preemptions: int
    matched_tokens: int
    loaded_blocks: int
    load_errors: int
    stored_blocks: int
    store_failures: int


@dataclasses.dataclass(frozen=True)
class SlotInfo(_Record):
    """A live slot (kvt_slot_info)."""
    _ctype = "kvt_slot_info"
    _enums = {"state": SlotState}

    req_id: str
    state: int
    age_ns: int
    tokens: int
    computed: int
    blocks: int
    batches: int


@dataclasses.dataclass(frozen=True)
class BatchInfo(_Record):
    """A batch in flight (kvt_batch_info): a load src -> G1 or a store G1 -> dst."""
    _ctype = "kvt_batch_info"
    _enums = {"src": Tier, "dst": Tier}

    req_id: str
    src: int
    dst: int
    batch: int
    blocks: int
    step: int


@dataclasses.dataclass(frozen=True)
class PauseInfo(_Record):
    """A paused scheduler call (kvt_pause_info): the call, the transition (prev -> state; both
    0 at a call's start), the breakpoint (0 for pause()), the pauses so far."""
    _ctype = "kvt_pause_info"
    _enums = {"trigger": ObsTrigger, "prev": SlotState, "state": SlotState}

    trigger: int
    prev: int
    state: int
    breakpoint: int
    pauses: int
    req_id: str


def _req_id(req_id):
    """A request id as the NUL-terminated bytes the library reads (borrowed for the call)."""
    if isinstance(req_id, str):
        b = req_id.encode()
    elif isinstance(req_id, bytes):
        b = req_id
    else:
        raise _invalid("a request id is a str or bytes, not %s" % type(req_id).__name__)
    if b"\0" in b:  # C would read the id cut there: two requests would share a slot
        raise _invalid("request id %r holds a NUL byte" % (req_id,))
    return b


def _bytes_in(data, what):
    """(pointer, length) of a bytes-like object, without a copy."""
    try:
        p = ffi.from_buffer(data)
    except TypeError as e:
        raise _invalid("%s must be bytes-like: %s" % (what, e)) from None
    return p, len(p)


def _strings(ptr, n):
    return [ffi.string(ptr[i]).decode(errors="replace") for i in range(n)]


def _opt_str(p) -> Optional[str]:
    return None if p == ffi.NULL else ffi.string(p).decode(errors="replace")


class Connector(_Handle):
    """Owns a kvt_connector over a Manager, which must stay open while the connector is
    (closing the manager closes its connector first). Use as a context manager, or call
    close(). Calls from several threads are serialized by the library. close() lets a call
    paused at a breakpoint go (any later pause lasts 1 ms), waits for the calls in flight on
    other threads (a wait_paused until its timeout; a pause_wait within 0.1 s), and then
    destroys the connector; calls after it began raise InvalidHandleError."""
    _closed_message = "the connector is closed"

    def __init__(self, manager, config: Optional[ConnectorConfig] = None, **fields):
        """config: a ConnectorConfig; fields: any of its fields by name, over config
        (role=ROLE_SCHEDULER, offload=OFFLOAD_LAZY, store_tier=G3, num_gpu_blocks=100,
        salt_hash=..., load_async=True, endpoint_path="/run/kvtier.sock",
        pause_timeout_ms=5000, world_size=2, rank=1, sliding_window=4096); the others keep
        ConnectorConfig's defaults."""
        cfg, keep = _merged(ConnectorConfig, config, fields, "connector config")._cdata()
        out = ffi.new("kvt_connector **")
        with manager._using() as m:  # the manager's close() finds this connector, or refuses it
            _call(C.kvt_connector_create, out, m, cfg)
            self.salt_hash = cfg.salt_hash
            self._m = manager
            self._keep = []  # the registered G1 buffers: the worker copies into them until close
            self._hooks = None  # the callbacks the library holds (set_hooks)
            self._endpoints = set()  # closed before the connector (kvt_endpoint_close)
            # The library's buffers last until the next call of the same kind from any thread:
            # each is copied out under its lock (the GIL is let go during the call).
            self._meta_lock = threading.Lock()
            self._finished_lock = threading.Lock()
            self._own(out[0])
            manager._connector = self

    def _close_first(self) -> None:
        for e in list(self._endpoints):
            e.close()

    def _let_go(self, c) -> None:
        """A scheduler call paused at a breakpoint (or by pause()) goes on, and any later pause
        lasts 1 ms: close() then waits for the calls in flight."""
        C.kvt_connector_set_pause_timeout(c, 1)
        C.kvt_connector_resume(c)  # KVT_ERR_STATE when nothing is paused: fine

    def _free(self, c) -> None:
        """Waits for the worker's copies in flight, releases every pin, frees the connector."""
        C.kvt_connector_destroy(c)
        self._keep = self._hooks = None
        if self._m._connector is self:
            self._m._connector = None

    # scheduler half
    def get_num_new_matched_tokens(self, req_id: ReqId, tokens, num_computed_tokens: int = 0,
                                   salt: Optional[int] = None,
                                   max_tokens: Optional[int] = None) -> Tuple[int, bool]:
        """(tokens kvtier can load beyond num_computed_tokens, whether the load is
        asynchronous). tokens: the request's tokens so far. salt: the request's own salt
        hash (an int from kvtier.hash_salt) naming its blocks; None: the connector's.
        max_tokens: a cap on the hit (one connector per KV cache group agreeing on one)."""
        toks, n = _u32_array(tokens, "tokens")
        num, is_async = ffi.new("uint64_t *"), ffi.new("int32_t *")
        if max_tokens is not None:
            with self._using() as c:
                _call(C.kvt_connector_get_num_new_matched_tokens_max, num, is_async, c,
                      _req_id(req_id), self.salt_hash if salt is None else salt, toks, n,
                      num_computed_tokens, max_tokens)
        elif salt is None:
            with self._using() as c:
                _call(C.kvt_connector_get_num_new_matched_tokens, num, is_async, c,
                      _req_id(req_id), toks, n, num_computed_tokens)
        else:
            with self._using() as c:
                _call(C.kvt_connector_get_num_new_matched_tokens_salted, num, is_async,
                      c, _req_id(req_id), salt, toks, n, num_computed_tokens)
        return num[0], bool(is_async[0])

    def update_state_after_alloc(self, req_id: ReqId, block_ids,
                                 num_external_tokens: int) -> None:
        """block_ids: all of the request's G1 blocks, in order (BLOCK_ID_NONE for a sliding
        window's null blocks); num_external_tokens: 0, or what get_num_new_matched_tokens
        reported."""
        ids, n = _u32_array(block_ids, "block_ids")
        with self._using() as c:
            _call(C.kvt_connector_update_state_after_alloc, c, _req_id(req_id), ids, n,
                  num_external_tokens)

    def build_connector_meta(self, reqs) -> bytes:
        """One step's metadata (bytes) for the worker. reqs: ScheduledRequest tuples (or
        dicts with its field names), every live request the step schedules."""
        reqs = [r if isinstance(r, ScheduledRequest) else
                ScheduledRequest(**r) if isinstance(r, dict) else ScheduledRequest(*r)
                for r in reqs]
        arr = ffi.new("kvt_scheduled_request[]", max(len(reqs), 1))
        keep = []
        for i, r in enumerate(reqs):
            rid = ffi.new("char[]", _req_id(r.req_id))
            blocks, nb = _u32_array(r.new_block_ids, "new_block_ids")
            toks, nt = _u32_array(r.new_token_ids, "new_token_ids")
            keep += [rid, blocks, toks]
            e = arr[i]
            e.req_id, e.new_block_ids, e.num_new_block_ids = rid, blocks, nb
            e.new_token_ids, e.num_new_token_ids = toks, nt
            try:
                e.num_computed_tokens = r.num_computed_tokens
                e.num_scheduled_tokens = r.num_scheduled_tokens
            except (OverflowError, TypeError) as err:
                raise _invalid("request %r: %s" % (r.req_id, err)) from None
        p, n = ffi.new("void **"), ffi.new("size_t *")
        with self._meta_lock, self._using() as c:
            _call(C.kvt_connector_build_connector_meta, p, n, c, arr, len(reqs))
            return ffi.buffer(p[0], n[0])[:] if n[0] else b""  # a copy: valid past the next

    def update_connector_output(self, report) -> None:
        """The worker's report (Finished.report, bytes)."""
        p, n = _bytes_in(report, "report")
        with self._using() as c:
            _call(C.kvt_connector_update_connector_output, c, p, n)

    def request_finished(self, req_id: ReqId) -> bool:
        """True when stores still read the request's G1 blocks: keep them until the worker
        lists it in finished_sending."""
        delay = ffi.new("int32_t *")
        with self._using() as c:
            _call(C.kvt_connector_request_finished, delay, c, _req_id(req_id))
        return bool(delay[0])

    def request_preempted(self, req_id: ReqId) -> None:
        with self._using() as c:
            _call(C.kvt_connector_request_preempted, c, _req_id(req_id))

    def reset_cache(self) -> None:
        """Nothing stored so far is served again (kvt_connector_reset_cache)."""
        with self._using() as c:
            _call(C.kvt_connector_reset_cache, c)

    def slot_state(self, req_id: ReqId) -> Tuple[SlotState, List[SlotState]]:
        """(state, [states so far, from SLOT_INITIALIZED on]) of a request's slot."""
        rid = _req_id(req_id)
        state, n = ffi.new("uint32_t *"), ffi.new("size_t *")
        cap = 16
        while True:
            hist = ffi.new("uint32_t[]", cap)
            with self._using() as c:
                _call(C.kvt_connector_slot_state, state, hist, n, cap, c, rid)
            if n[0] <= cap:
                return (_member(SlotState, state[0]),
                        [_member(SlotState, h) for h in ffi.unpack(hist, n[0])])
            cap = n[0]

    def stats(self) -> ConnectorStats:
        """The scheduler half's counters (kvt_connector_stats)."""
        s = _versioned("kvt_connector_stats")
        with self._using() as c:
            _call(C.kvt_connector_stats_get, s, c)
        return ConnectorStats._from_c(s)

    def take_events(self, max_events: int = 256) -> List[Event]:
        """The manager's pending events (BLOCK_STORED/REMOVED of G2 and G3), oldest first."""
        buf = ffi.new("kvt_event[]", max_events)
        with self._using() as c:
            n = C.kvt_connector_drain_events(c, buf, max_events)
        return [Event._from_c(e) for e in buf[0:n]]

    def set_hooks(self, will_call: Optional[Callable[[ObsTrigger, Optional[str]], None]] = None,
                  finished_call: Optional[Callable[[ObsTrigger, Optional[str], int], None]]
                  = None,
                  transition: Optional[Callable[[str, int, SlotState, ObsTrigger], None]]
                  = None) -> None:
        """Interceptors around the scheduler half, for tracing and tests
        (kvt_connector_set_hooks): will_call(trigger, req_id) at the start of each of its
        calls, finished_call(trigger, req_id, status) at its end, transition(req_id, from,
        to, trigger) after each slot transition (from 0 for a new slot). req_id is None for
        build_connector_meta and update_connector_output. They run on the calling thread
        under the connector's lock, so they must not call this connector; an exception they
        raise is printed and dropped. Each call replaces the hooks set before; none
        removes them."""
        callbacks = []

        def hook(field, signature, fn, convert):
            if fn is not None:
                callbacks.append(ffi.callback(signature, lambda _user, *a: fn(*convert(*a))))
                setattr(hooks, field, callbacks[-1])

        hooks = ffi.NULL
        if any((will_call, finished_call, transition)):
            hooks = _versioned("kvt_connector_hooks")
            hook("will_call", "void(void *, uint32_t, const char *)", will_call,
                 lambda t, r: (_member(ObsTrigger, t), _opt_str(r)))
            hook("finished_call", "void(void *, uint32_t, const char *, int32_t)",
                 finished_call, lambda t, r, st: (_member(ObsTrigger, t), _opt_str(r), st))
            hook("transition", "void(void *, const char *, uint32_t, uint32_t, uint32_t)",
                 transition, lambda r, a, b, t: (_opt_str(r), _member(SlotState, a),
                                                 _member(SlotState, b), _member(ObsTrigger, t)))
        with self._using() as c:
            _call(C.kvt_connector_set_hooks, c, hooks)
        # The library calls them until replaced or destroyed; the call took the connector's
        # lock, so the hooks it replaced run no more.
        self._hooks = (hooks, callbacks)

    # worker half
    def register_kv_caches(self, layout, num_blocks: int) -> None:
        """The engine's G1 memory: num_blocks blocks in a kvtier.G1Layout whose bases are
        writable buffers or (address, length) pairs; the buffers are kept alive until
        close()."""
        m = self._m
        shape = types.SimpleNamespace(num_layers=m._shape[0], num_outer=m._shape[1],
                                      chunk_bytes=m._shape[2], g1_blocks=num_blocks)
        cdata, held = layout._cdata(shape)
        with self._using() as c:
            _call(C.kvt_connector_register_kv_caches, c, cdata, num_blocks)
        self._keep.extend(held)

    def bind_connector_metadata(self, meta) -> None:
        """Holds a step's metadata (bytes from build_connector_meta) until
        clear_connector_metadata."""
        p, n = _bytes_in(meta, "meta")
        with self._using() as c:
            _call(C.kvt_connector_bind_connector_metadata, c, p, n)

    def clear_connector_metadata(self) -> None:
        with self._using() as c:
            _call(C.kvt_connector_clear_connector_metadata, c)

    def start_load_kv(self) -> None:
        with self._using() as c:
            _call(C.kvt_connector_start_load_kv, c)

    def wait_for_layer_load(self, layer: int) -> None:
        with self._using() as c:
            _call(C.kvt_connector_wait_for_layer_load, c, layer)

    def save_kv_layer(self, layer: int) -> None:
        with self._using() as c:
            _call(C.kvt_connector_save_kv_layer, c, layer)

    def wait_for_save(self) -> None:
        with self._using() as c:
            _call(C.kvt_connector_wait_for_save, c)

    def handle_preemptions(self, req_ids) -> None:
        """Waits until no copy in flight uses the G1 blocks of these requests."""
        ids = [ffi.new("char[]", _req_id(r)) for r in req_ids]
        arr = ffi.new("const char *[]", ids) if ids else ffi.NULL
        with self._using() as c:
            _call(C.kvt_connector_handle_preemptions, c, arr, len(ids))

    def get_finished(self) -> Finished:
        """Everything that ended since the last call, as a Finished; never waits."""
        f = _versioned("kvt_finished")
        with self._finished_lock, self._using() as c:  # the buffers live until destroy too
            _call(C.kvt_connector_get_finished, f, c)
            return Finished(_strings(f.finished_sending, f.num_finished_sending),
                            _strings(f.finished_recving, f.num_finished_recving),
                            ffi.unpack(f.load_error_block_ids, f.num_load_errors)
                            if f.num_load_errors else [],
                            ffi.buffer(f.report, f.report_len)[:] if f.report_len else b"")

    # inspection, breakpoints and rerun (kvtier.h, "Observe")
    def _listed(self, fn, record):
        n = ffi.new("size_t *")
        with self._using() as c:
            _call(fn, ffi.NULL, 0, n, c)
            while True:
                cap = n[0]
                buf = ffi.new(record._ctype + "[]", max(cap, 1))
                _call(fn, buf, cap, n, c)
                if n[0] <= cap:
                    return [record._from_c(buf[i]) for i in range(n[0])]

    def slots(self) -> List[SlotInfo]:
        """The live slots (answered from the pause while the scheduler is paused)."""
        return self._listed(C.kvt_connector_slots, SlotInfo)

    def batches(self) -> List[BatchInfo]:
        """The batches in flight (planned, or sent and not yet reported)."""
        return self._listed(C.kvt_connector_batches, BatchInfo)

    def add_breakpoint(self, state: int = 0, req_id: Optional[ReqId] = None) -> int:
        """A breakpoint on a slot entering `state` (0: any) and/or on a request; its id."""
        out = ffi.new("uint64_t *")
        rid = ffi.NULL if req_id is None else _req_id(req_id)
        with self._using() as c:
            _call(C.kvt_connector_breakpoint_add, out, c, state, rid)
        return out[0]

    def remove_breakpoint(self, breakpoint_id: int) -> None:
        with self._using() as c:
            _call(C.kvt_connector_breakpoint_remove, c, breakpoint_id)

    def pause(self) -> None:
        """Pauses the next scheduler call or transition."""
        with self._using() as c:
            _call(C.kvt_connector_pause, c)

    def resume(self) -> None:
        with self._using() as c:
            _call(C.kvt_connector_resume, c)

    def wait_paused(self, timeout_ms: int) -> Optional[PauseInfo]:
        """The pause once a thread is paused; None when none paused within timeout_ms (0:
        only looks). pause_wait() is the form with a timeout in seconds."""
        p = _versioned("kvt_pause_info")
        with self._using() as c:
            ms = ffi.new("uint32_t *", timeout_ms)[0]  # a uint32_t, as it has always been
            status = C.kvt_connector_pause_wait(p, c, ms * 1000000)
        if status == TIMEOUT:
            return None
        _check(status)
        return PauseInfo._from_c(p)

    # How long one library wait of pause_wait lasts at most: close() waits for it to end.
    _PAUSE_WAIT_SLICE_S = 0.1

    def pause_wait(self, timeout: Optional[float] = None) -> PauseInfo:
        """Waits for a thread to pause (at a breakpoint, or after pause()) and describes its
        pause. timeout in seconds (None: forever, 0: only looks); TimeoutError when none
        paused by then. The wait is made of library waits of at most 0.1 s, so that a close()
        meanwhile ends it (InvalidHandleError) rather than wait for a pause that may never
        come: nothing but a pause ends the library's wait."""
        if timeout is not None and not timeout >= 0:
            raise _invalid("pause_wait: timeout must be None or at least 0 s, not %r"
                           % (timeout,))
        p = _versioned("kvt_pause_info")
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = self._PAUSE_WAIT_SLICE_S if deadline is None else \
                min(max(deadline - time.monotonic(), 0.0), self._PAUSE_WAIT_SLICE_S)
            with self._using() as c:
                status = C.kvt_connector_pause_wait(p, c, int(left * 1e9))
            if status == OK:
                return PauseInfo._from_c(p)
            if status != TIMEOUT:
                _check(status)
            if deadline is not None and time.monotonic() >= deadline:
                # its own message: the library's names the last slice, not the whole wait
                raise TimeoutError("no thread paused within %g s" % timeout, status)

    def set_pause_timeout(self, timeout_ms: int) -> None:
        with self._using() as c:
            _call(C.kvt_connector_set_pause_timeout, c, timeout_ms)

    def rerun(self, path) -> LogReplay:
        """kvt_event_log_rerun: the log's calls made again on this (fresh) connector, and
        the counts (calls, violations, live_slots, registered, ...); CorruptError, with the
        counts as .replay, naming the first difference when the end state differs from the
        log's."""
        with self._using() as c:
            return _replayed(C.kvt_event_log_rerun, c, path)
