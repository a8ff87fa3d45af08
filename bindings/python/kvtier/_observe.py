"""The observe stream (docs/EVENTS.md): subscriptions, event logs, their replay, and the
names of its codes."""
import dataclasses
import os
from typing import Iterator, List, Optional, Union

from ._enums import (CandidateState, ObsKind, ObsTrigger, SlotState, Tier, _member,
                     _obs_kind)
from ._errors import ITEROVER, OK, CorruptError, InvalidHandleError, StateError, _check, _error
from ._ffi import C, CONST, ffi
from ._util import _NO_HANDLE, _Handle, _path, _readable, _Record, _versioned


def obs_kind_str(kind: int) -> str:
    """The name of a kvt_obs_kind, e.g. "SLOT"; "UNKNOWN" otherwise."""
    return ffi.string(C.kvt_obs_kind_str(kind)).decode()


def candidate_state_str(state: int) -> str:
    """The name of a kvt_candidate_state, e.g. "PROMOTED"; "UNKNOWN" otherwise."""
    return ffi.string(C.kvt_candidate_state_str(state)).decode()


def obs_trigger_str(trigger: int) -> str:
    """The name of a kvt_obs_trigger, e.g. "UPDATE_STATE_AFTER_ALLOC"; "UNKNOWN" otherwise."""
    return ffi.string(C.kvt_obs_trigger_str(trigger)).decode()


@dataclasses.dataclass(frozen=True)
class ObsEvent(_Record):
    """One event of the observe stream (kvt_obs_event); which fields mean something depends
    on the kind (docs/EVENTS.md). state is a SlotState for SLOT events and a CandidateState
    for CANDIDATE ones; prev a SlotState."""
    _ctype = "kvt_obs_event"
    _enums = {"trigger": ObsTrigger, "src": Tier, "dst": Tier}

    seq: int
    time_ns: int
    kind: Union[ObsKind, str]
    state: int
    prev: int
    trigger: int
    src: int
    dst: int
    status: int
    batch: int
    hash: int
    parent_hash: int
    tokens: int
    computed: int
    blocks: int
    bytes: int
    duration_ns: int
    count: int
    req_id: str

    @classmethod
    def _of(cls, e) -> "ObsEvent":
        kind = _obs_kind(e.kind)
        if kind == ObsKind.SLOT:
            return cls._from_c(e, kind=kind, state=_member(SlotState, e.state),
                               prev=_member(SlotState, e.prev))
        if kind == ObsKind.CANDIDATE:
            return cls._from_c(e, kind=kind, state=_member(CandidateState, e.state))
        return cls._from_c(e, kind=kind)

    def to_json(self) -> str:
        """This event as one line of JSON: the library's one mapping (kvt_obs_event_json),
        the text that the management endpoint and kvtier-events --json give."""
        e = ffi.new("kvt_obs_event *")
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name == "kind":
                v = v.code if isinstance(v, ObsKind) else 0  # a kind this binding lacks
            elif f.name == "req_id":
                v = v.encode(errors="replace")[:CONST["KVT_REQ_ID_MAX"]]
            setattr(e, f.name, v)
        n = ffi.new("size_t *")
        _check(C.kvt_obs_event_json(ffi.NULL, 0, n, e))
        buf = ffi.new("char[]", n[0] + 1)
        _check(C.kvt_obs_event_json(buf, len(buf), n, e))
        return ffi.string(buf, n[0]).decode(errors="replace")


class Subscription(_Handle):
    """A reader of a manager's observe events (kvt_subscription_create) with a queue of
    `capacity`: drain() returns the queued events, oldest first (a DROPPED event first when
    the queue overflowed); fileno() is readable while events are queued, and wait_async()
    awaits them. It may outlive its manager (and then receives nothing)."""
    _closed_error = StateError
    _closed_message = "the subscription is closed"

    def __init__(self, manager, capacity: int):
        out = ffi.new("kvt_subscription **")
        with manager._using() as m:
            _check(C.kvt_subscription_create(out, m, capacity))
        self._own(out[0])

    def _free(self, s) -> None:
        C.kvt_subscription_destroy(s)

    def drain(self, max_events: int = 1024) -> List[ObsEvent]:
        buf = ffi.new("kvt_obs_event[]", max_events)
        with self._using() as sub:
            n = C.kvt_subscription_drain(sub, buf, max_events)
        return [ObsEvent._of(e) for e in buf[0:n]]

    def fileno(self) -> int:
        with self._using() as sub:
            return C.kvt_subscription_fd(sub)

    async def wait_async(self, max_events: int = 1024,
                         timeout: Optional[float] = None) -> List[ObsEvent]:
        """Waits in the running asyncio loop until events are queued, then drains them.
        asyncio.TimeoutError when none came within timeout seconds."""
        while True:
            events = self.drain(max_events)
            if events:
                return events
            await _readable(self.fileno(), timeout)


class EventLog(_Handle):
    """Iterates the records of an event log (Manager.record, kvtier-replay --record) as
    ObsEvents. A torn tail ends the iteration; `torn` then says so and `why` where."""
    _closed_error = InvalidHandleError
    _closed_message = "the event log is closed"

    def __init__(self, path: Union[str, bytes, os.PathLike]):
        out = ffi.new("kvt_event_log **")
        _check(C.kvt_event_log_open(out, _path(path)))
        self._own(out[0])
        self.torn, self.why = False, ""

    def _free(self, log) -> None:
        C.kvt_event_log_close(log)

    def __iter__(self) -> Iterator[ObsEvent]:
        e = ffi.new("kvt_obs_event *")
        while True:
            with self._using() as log:
                st = C.kvt_event_log_read(e, log)
            if st == ITEROVER:  # past the last record
                return
            if st == CorruptError.status:
                self.torn, self.why = True, ffi.string(C.kvt_last_error()).decode()
                return
            _check(st)
            yield ObsEvent._of(e)


@dataclasses.dataclass(frozen=True)
class LogReplay(_Record):
    """What a replay (replay_log) or a rerun (Connector.rerun) of an event log found
    (kvt_log_replay). transitions[from][to] by slot state; registered[tier]: the hashes
    each tier holds at the end."""
    _ctype = "kvt_log_replay"

    torn: int
    events: int
    violations: int
    live_slots: int
    finished_slots: int
    open_batches: int
    loaded_blocks: int
    transitions: List[List[int]]
    registered: List[int]
    calls: int


def _replayed(fn, handle, path) -> LogReplay:
    """fn(out, handle, path) of kvt_event_log_replay or kvt_event_log_rerun; a CorruptError
    (something violated or differed) carries the counts as .replay."""
    r = _versioned("kvt_log_replay")
    st = fn(r, handle, _path(path))
    if st == OK:
        return LogReplay._from_c(r)
    e = _error(st)
    if st == CorruptError.status:
        e.replay = LogReplay._from_c(r)
    raise e


def replay_log(path: Union[str, bytes, os.PathLike], manager=None) -> LogReplay:
    """Checks an event log (kvt_event_log_replay): slot transitions, batch ends, sequence
    numbers; with a manager (a fresh one, the recorded one's tiers and capacities at least),
    its BLOCK_* events are applied to it, so that it ends with the recorded registry.
    CorruptError, with .replay, at the first violation."""
    with (_NO_HANDLE if manager is None else manager._using()) as m:
        return _replayed(C.kvt_event_log_replay, m, path)
