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
import os
import threading
import types

from . import (CONST, Event, InvalidArgumentError, InvalidHandleError, _check, _fields,
               _u32_array)
from ._ffi import C, ffi

ROLE_SCHEDULER, ROLE_WORKER, ROLE_BOTH = (
    C.KVT_ROLE_SCHEDULER, C.KVT_ROLE_WORKER, C.KVT_ROLE_BOTH)
OFFLOAD_EAGER, OFFLOAD_LAZY = C.KVT_OFFLOAD_EAGER, C.KVT_OFFLOAD_LAZY
BLOCK_ID_NONE = CONST["KVT_BLOCK_ID_NONE"]  # a sliding window's null block
SLOT_STATES = tuple(range(C.KVT_SLOT_INITIALIZED, C.KVT_SLOT_FINISHED + 1))
(SLOT_INITIALIZED, SLOT_ONBOARD_STAGED, SLOT_ONBOARDING, SLOT_PREFILLING, SLOT_DECODING,
 SLOT_SKIPPED_PREFILL, SLOT_SKIPPED_DECODE, SLOT_PREEMPTED, SLOT_FINISHING,
 SLOT_FINISHED) = SLOT_STATES


def slot_state_str(state):
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


def _req_id(req_id):
    """A request id as the NUL-terminated bytes the library reads (borrowed for the call)."""
    if isinstance(req_id, str):
        return req_id.encode()
    if isinstance(req_id, bytes):
        return req_id
    raise InvalidArgumentError("a request id is a str or bytes, not %s" % type(req_id).__name__,
                               CONST["KVT_ERR_INVALID_ARGUMENT"])


def _bytes_in(data, what):
    """(pointer, length) of a bytes-like object, without a copy."""
    try:
        p = ffi.from_buffer(data)
    except TypeError as e:
        raise InvalidArgumentError("%s must be bytes-like: %s" % (what, e),
                                   CONST["KVT_ERR_INVALID_ARGUMENT"]) from None
    return p, len(p)


def _call(fn, *args):
    """Calls fn and raises the binding's error for its status; an argument C cannot take (a
    negative count, a layer that is not an int) is an InvalidArgumentError, not a cffi one."""
    try:
        status = fn(*args)
    except (OverflowError, TypeError) as e:
        raise InvalidArgumentError("%s: %s" % (fn.__name__, e),
                                   CONST["KVT_ERR_INVALID_ARGUMENT"]) from None
    _check(status)


def _strings(ptr, n):
    return [ffi.string(ptr[i]).decode(errors="replace") for i in range(n)]


_CONFIG_FIELDS = frozenset(name for name, _ in ffi.typeof("kvt_connector_config").fields
                           if name not in ("struct_size", "reserved", "reserved2"))


class Connector:
    """Owns a kvt_connector over a Manager, which must stay open while the connector is
    (closing the manager closes its connector first). Use as a context manager, or call
    close(). Calls from several threads are serialized by the library."""

    def __init__(self, manager, **config):
        """config: any field of kvt_connector_config by name (role=ROLE_SCHEDULER,
        offload=OFFLOAD_LAZY, store_tier=G3, num_gpu_blocks=100, salt_hash=...,
        load_async=True, endpoint_path="/run/kvtier.sock", pause_timeout_ms=5000); the
        others keep the library's defaults."""
        cfg = ffi.new("kvt_connector_config *")
        C.kvt_connector_config_init_sized(cfg, ffi.sizeof("kvt_connector_config"))
        strings = []  # borrowed by the config until create returns
        for k, v in config.items():
            if k not in _CONFIG_FIELDS:
                raise InvalidArgumentError("unknown connector config field %r" % k,
                                           CONST["KVT_ERR_INVALID_ARGUMENT"])
            if k == "endpoint_path":
                if v is not None:
                    strings.append(ffi.new("char[]", os.fsencode(v)))
                    cfg.endpoint_path = strings[-1]
                continue
            try:
                setattr(cfg, k, int(v))
            except (OverflowError, TypeError, ValueError) as e:
                raise InvalidArgumentError("connector config %s: %s" % (k, e),
                                           CONST["KVT_ERR_INVALID_ARGUMENT"]) from None
        out = ffi.new("kvt_connector **")
        _call(C.kvt_connector_create, out, manager._live(), cfg)
        self._c = out[0]
        self.salt_hash = cfg.salt_hash
        self._m = manager
        self._keep = []  # the registered G1 buffers: the worker copies into them until close
        self._lock = threading.Lock()  # guards close() against itself only
        manager._connector = self

    # lifetime
    def _live(self):
        c = self._c
        if c is None:
            raise InvalidHandleError("the connector is closed", CONST["KVT_ERR_INVALID_HANDLE"])
        return c

    def close(self):
        """Waits for the worker's copies in flight, releases every pin, frees the connector."""
        with self._lock:
            if self._c is None:
                return
            C.kvt_connector_destroy(self._c)
            self._c = None
            self._keep = None
            if self._m._connector is self:
                self._m._connector = None

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
        return self._c is None

    # scheduler half
    def get_num_new_matched_tokens(self, req_id, tokens, num_computed_tokens=0, salt=None,
                                   max_tokens=None):
        """(tokens kvtier can load beyond num_computed_tokens, whether the load is
        asynchronous). tokens: the request's tokens so far. salt: the request's own salt
        hash (an int from kvtier.hash_salt) naming its blocks; None: the connector's.
        max_tokens: a cap on the hit (one connector per KV cache group agreeing on one)."""
        toks, n = _u32_array(tokens, "tokens")
        num, is_async = ffi.new("uint64_t *"), ffi.new("int32_t *")
        if max_tokens is not None:
            _call(C.kvt_connector_get_num_new_matched_tokens_max, num, is_async, self._live(),
                  _req_id(req_id), self.salt_hash if salt is None else salt, toks, n,
                  num_computed_tokens, max_tokens)
        elif salt is None:
            _call(C.kvt_connector_get_num_new_matched_tokens, num, is_async, self._live(),
                  _req_id(req_id), toks, n, num_computed_tokens)
        else:
            _call(C.kvt_connector_get_num_new_matched_tokens_salted, num, is_async,
                  self._live(), _req_id(req_id), salt, toks, n, num_computed_tokens)
        return num[0], bool(is_async[0])

    def update_state_after_alloc(self, req_id, block_ids, num_external_tokens):
        """block_ids: all of the request's G1 blocks, in order (BLOCK_ID_NONE for a sliding
        window's null blocks); num_external_tokens: 0, or what get_num_new_matched_tokens
        reported."""
        ids, n = _u32_array(block_ids, "block_ids")
        _call(C.kvt_connector_update_state_after_alloc, self._live(), _req_id(req_id), ids, n,
              num_external_tokens)

    def build_connector_meta(self, reqs):
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
                raise InvalidArgumentError("request %r: %s" % (r.req_id, err),
                                           CONST["KVT_ERR_INVALID_ARGUMENT"]) from None
        p, n = ffi.new("void **"), ffi.new("size_t *")
        _call(C.kvt_connector_build_connector_meta, p, n, self._live(), arr, len(reqs))
        return ffi.buffer(p[0], n[0])[:] if n[0] else b""  # a copy: valid past the next call

    def update_connector_output(self, report):
        """The worker's report (Finished.report, bytes)."""
        p, n = _bytes_in(report, "report")
        _call(C.kvt_connector_update_connector_output, self._live(), p, n)

    def request_finished(self, req_id):
        """True when stores still read the request's G1 blocks: keep them until the worker
        lists it in finished_sending."""
        delay = ffi.new("int32_t *")
        _call(C.kvt_connector_request_finished, delay, self._live(), _req_id(req_id))
        return bool(delay[0])

    def request_preempted(self, req_id):
        _call(C.kvt_connector_request_preempted, self._live(), _req_id(req_id))

    def reset_cache(self):
        """Nothing stored so far is served again (kvt_connector_reset_cache)."""
        _call(C.kvt_connector_reset_cache, self._live())

    def slot_state(self, req_id):
        """(state, [states so far, from SLOT_INITIALIZED on]) of a request's slot."""
        rid = _req_id(req_id)
        state, n = ffi.new("uint32_t *"), ffi.new("size_t *")
        cap = 16
        while True:
            hist = ffi.new("uint32_t[]", cap)
            _call(C.kvt_connector_slot_state, state, hist, n, cap, self._live(), rid)
            if n[0] <= cap:
                return state[0], ffi.unpack(hist, n[0])
            cap = n[0]

    def stats(self):
        """The scheduler half's counters (kvt_connector_stats) as a dict; transitions as an
        11 x 11 list of lists indexed [from][to] by slot state (from 0: slot created)."""
        s = ffi.new("kvt_connector_stats *")
        s.struct_size = ffi.sizeof("kvt_connector_stats")
        _call(C.kvt_connector_stats_get, s, self._live())
        out = _fields(s)
        out["transitions"] = [list(row) for row in s.transitions]
        return out

    def take_events(self, max_events=256):
        """The manager's pending events (BLOCK_STORED/REMOVED of G2 and G3), oldest first."""
        buf = ffi.new("kvt_event[]", max_events)
        n = C.kvt_connector_take_events(buf, max_events, self._live())
        return [Event(e.type, e.status, e.tier, e.user_data, e.hash, e.parent_hash, e.count)
                for e in buf[0:n]]

    # worker half
    def register_kv_caches(self, layout, num_blocks):
        """The engine's G1 memory: num_blocks blocks in a kvtier.G1Layout whose bases are
        writable buffers or (address, length) pairs; the buffers are kept alive until
        close()."""
        m = self._m
        shape = types.SimpleNamespace(num_layers=m._shape[0], num_outer=m._shape[1],
                                      chunk_bytes=m._shape[2], g1_blocks=num_blocks)
        cdata, held = layout._cdata(shape)
        _call(C.kvt_connector_register_kv_caches, self._live(), cdata, num_blocks)
        self._keep.extend(held)

    def bind_connector_metadata(self, meta):
        """Holds a step's metadata (bytes from build_connector_meta) until
        clear_connector_metadata."""
        p, n = _bytes_in(meta, "meta")
        _call(C.kvt_connector_bind_connector_metadata, self._live(), p, n)

    def clear_connector_metadata(self):
        _call(C.kvt_connector_clear_connector_metadata, self._live())

    def start_load_kv(self):
        _call(C.kvt_connector_start_load_kv, self._live())

    def wait_for_layer_load(self, layer):
        _call(C.kvt_connector_wait_for_layer_load, self._live(), layer)

    def save_kv_layer(self, layer):
        _call(C.kvt_connector_save_kv_layer, self._live(), layer)

    def wait_for_save(self):
        _call(C.kvt_connector_wait_for_save, self._live())

    def handle_preemptions(self, req_ids):
        """Waits until no copy in flight uses the G1 blocks of these requests."""
        ids = [ffi.new("char[]", _req_id(r)) for r in req_ids]
        arr = ffi.new("const char *[]", ids) if ids else ffi.NULL
        _call(C.kvt_connector_handle_preemptions, self._live(), arr, len(ids))

    def get_finished(self):
        """Everything that ended since the last call, as a Finished; never waits."""
        f = ffi.new("kvt_finished *")
        f.struct_size = ffi.sizeof("kvt_finished")
        _call(C.kvt_connector_get_finished, f, self._live())
        return Finished(_strings(f.finished_sending, f.num_finished_sending),
                        _strings(f.finished_recving, f.num_finished_recving),
                        ffi.unpack(f.load_error_block_ids, f.num_load_errors)
                        if f.num_load_errors else [],
                        ffi.buffer(f.report, f.report_len)[:] if f.report_len else b"")

    # inspection, breakpoints and rerun (kvtier.h, "Observe")
    def _listed(self, fn, ctype, convert):
        n = ffi.new("size_t *")
        _call(fn, ffi.NULL, 0, n, self._live())
        while True:
            cap = n[0]
            buf = ffi.new(ctype + "[]", max(cap, 1))
            _call(fn, buf, cap, n, self._live())
            if n[0] <= cap:
                return [convert(buf[i]) for i in range(n[0])]

    def slots(self):
        """The live slots as dicts: req_id, state, age_ns, tokens, computed, blocks, batches
        (answered from the pause while the scheduler is paused)."""
        return self._listed(C.kvt_connector_slots, "kvt_slot_info", lambda s: {
            "req_id": ffi.string(s.req_id).decode(errors="replace"), "state": s.state,
            "age_ns": s.age_ns, "tokens": s.tokens, "computed": s.computed,
            "blocks": s.blocks, "batches": s.batches})

    def batches(self):
        """The batches in flight as dicts: req_id, src, dst, batch, blocks, step."""
        return self._listed(C.kvt_connector_batches, "kvt_batch_info", lambda b: {
            "req_id": ffi.string(b.req_id).decode(errors="replace"), "src": b.src,
            "dst": b.dst, "batch": b.batch, "blocks": b.blocks, "step": b.step})

    def add_breakpoint(self, state=0, req_id=None):
        """A breakpoint on a slot entering `state` (0: any) and/or on a request; its id."""
        out = ffi.new("uint64_t *")
        rid = ffi.NULL if req_id is None else _req_id(req_id)
        _call(C.kvt_connector_breakpoint_add, out, self._live(), state, rid)
        return out[0]

    def remove_breakpoint(self, breakpoint_id):
        _call(C.kvt_connector_breakpoint_remove, self._live(), breakpoint_id)

    def pause(self):
        """Pauses the next scheduler call or transition."""
        _call(C.kvt_connector_pause, self._live())

    def resume(self):
        _call(C.kvt_connector_resume, self._live())

    def wait_paused(self, timeout_ms):
        """A dict describing the pause (trigger, prev, state, breakpoint, pauses, req_id) once
        a thread is paused; None when none paused within timeout_ms."""
        p = ffi.new("kvt_pause_info *")
        p.struct_size = ffi.sizeof("kvt_pause_info")
        status = C.kvt_connector_wait_paused(p, self._live(), timeout_ms)
        if status == CONST["KVT_AGAIN"]:
            return None
        _check(status)
        return {"trigger": p.trigger, "prev": p.prev, "state": p.state,
                "breakpoint": p.breakpoint, "pauses": p.pauses,
                "req_id": ffi.string(p.req_id).decode(errors="replace")}

    def set_pause_timeout(self, timeout_ms):
        _call(C.kvt_connector_set_pause_timeout, self._live(), timeout_ms)

    def rerun(self, path):
        """kvt_event_log_rerun: the log's calls made again on this (fresh) connector. The
        counts as a dict (calls, violations, live_slots, registered, ...); CorruptError with
        the first difference when the end state differs from the log's."""
        r = ffi.new("kvt_log_replay *")
        r.struct_size = ffi.sizeof("kvt_log_replay")
        _call(C.kvt_event_log_rerun, r, self._live(), os.fsencode(path))
        out = _fields(r)
        out["transitions"] = [list(row) for row in r.transitions]
        out["registered"] = list(r.registered)
        return out
