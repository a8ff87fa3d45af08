"""The header's enums as IntEnums: they compare equal to the plain ints the C calls take and
earlier versions of this binding returned, and print by name."""
import enum
from typing import Type, TypeVar, Union

from ._ffi import C, CONST, ffi

E = TypeVar("E", bound=enum.Enum)


def _member(cls: Type[E], value: int) -> Union[E, int]:
    """value as a member of cls; a value this binding does not know (a newer library's, or 0
    for "none") stays the int it is."""
    try:
        return cls(value)
    except ValueError:
        return value


class Tier(enum.IntEnum):
    """kvt_tier. G4 is the remote tier on Redis: transfers and the g4_* calls only."""
    G1 = C.KVT_TIER_G1
    G2 = C.KVT_TIER_G2
    G3 = C.KVT_TIER_G3
    G4 = C.KVT_TIER_G4


class BlockState(enum.IntEnum):
    """kvt_block_state: EMPTY -> (token path) PARTIAL, READY, INFLIGHT, COMPLETE ->
    REGISTERED; INACTIVE is registered and unreferenced."""
    EMPTY = C.KVT_BLOCK_EMPTY
    PARTIAL = C.KVT_BLOCK_PARTIAL
    READY = C.KVT_BLOCK_READY
    INFLIGHT = C.KVT_BLOCK_INFLIGHT
    COMPLETE = C.KVT_BLOCK_COMPLETE
    REGISTERED = C.KVT_BLOCK_REGISTERED
    INACTIVE = C.KVT_BLOCK_INACTIVE


class XferState(enum.IntEnum):
    """kvt_xfer_state: where a transfer is (Transfer.state)."""
    QUEUED = C.KVT_XFER_QUEUED
    EVALUATING = C.KVT_XFER_EVALUATING
    WAITING = C.KVT_XFER_WAITING
    BATCHED = C.KVT_XFER_BATCHED
    INFLIGHT = C.KVT_XFER_INFLIGHT
    DONE = C.KVT_XFER_DONE
    CANCELLED = C.KVT_XFER_CANCELLED
    FAILED = C.KVT_XFER_FAILED


class EventType(enum.IntEnum):
    """kvt_event_type: Event.type of Manager.poll and Connector.take_events."""
    XFER_DONE = C.KVT_EVENT_XFER_DONE
    BLOCK_STORED = C.KVT_EVENT_BLOCK_STORED
    BLOCK_REMOVED = C.KVT_EVENT_BLOCK_REMOVED
    EVENTS_DROPPED = C.KVT_EVENT_EVENTS_DROPPED
    TIER_CLEARED = C.KVT_EVENT_TIER_CLEARED


class SlotState(enum.IntEnum):
    """kvt_slot_state: a connector's request slot (docs/CONNECTOR.md has the transitions)."""
    INITIALIZED = C.KVT_SLOT_INITIALIZED
    ONBOARD_STAGED = C.KVT_SLOT_ONBOARD_STAGED
    ONBOARDING = C.KVT_SLOT_ONBOARDING
    PREFILLING = C.KVT_SLOT_PREFILLING
    DECODING = C.KVT_SLOT_DECODING
    SKIPPED_PREFILL = C.KVT_SLOT_SKIPPED_PREFILL
    SKIPPED_DECODE = C.KVT_SLOT_SKIPPED_DECODE
    PREEMPTED = C.KVT_SLOT_PREEMPTED
    FINISHING = C.KVT_SLOT_FINISHING
    FINISHED = C.KVT_SLOT_FINISHED


class CandidateState(enum.IntEnum):
    """kvt_candidate_state: the state of a connector batch in a CANDIDATE observe event."""
    PENDING_EVALUATION = C.KVT_CANDIDATE_PENDING_EVALUATION
    PROMOTED = C.KVT_CANDIDATE_PROMOTED
    SKIPPED = C.KVT_CANDIDATE_SKIPPED
    COMPLETED = C.KVT_CANDIDATE_COMPLETED
    FAILED = C.KVT_CANDIDATE_FAILED
    CANCELLED = C.KVT_CANDIDATE_CANCELLED


class ObsTrigger(enum.IntEnum):
    """kvt_obs_trigger: the connector call behind a slot transition, a CALL event, a pause
    or a hook."""
    GET_NUM_NEW_MATCHED_TOKENS = C.KVT_TRIGGER_GET_NUM_NEW_MATCHED_TOKENS
    UPDATE_STATE_AFTER_ALLOC = C.KVT_TRIGGER_UPDATE_STATE_AFTER_ALLOC
    BUILD_CONNECTOR_META = C.KVT_TRIGGER_BUILD_CONNECTOR_META
    UPDATE_CONNECTOR_OUTPUT = C.KVT_TRIGGER_UPDATE_CONNECTOR_OUTPUT
    REQUEST_FINISHED = C.KVT_TRIGGER_REQUEST_FINISHED
    REQUEST_PREEMPTED = C.KVT_TRIGGER_REQUEST_PREEMPTED
    RESET_CACHE = C.KVT_TRIGGER_RESET_CACHE


class ObsKind(str, enum.Enum):
    """kvt_obs_kind, by name: observe events have always carried their kind as the name
    kvt_obs_kind_str gives ("SLOT", "BLOCK_STORED"), so a str enum keeps `e.kind ==
    "SLOT"` true; .code is the C number."""
    SLOT = "SLOT"
    CANDIDATE = "CANDIDATE"
    BLOCK_STORED = "BLOCK_STORED"
    BLOCK_REMOVED = "BLOCK_REMOVED"
    TIER_CLEARED = "TIER_CLEARED"
    TRANSFER = "TRANSFER"
    DROPPED = "DROPPED"
    CALL = "CALL"

    __str__ = str.__str__

    @property
    def code(self) -> int:
        return getattr(C, "KVT_OBS_" + self.value)


_OBS_KINDS = {k.code: k for k in ObsKind}


def _obs_kind(code: int) -> Union[ObsKind, str]:
    """The kind of an observe event; a kind this binding does not know by its C name."""
    return _OBS_KINDS.get(code) or ffi.string(C.kvt_obs_kind_str(code)).decode()


class MemoryKind(enum.IntEnum):
    """kvt_memory_kind: where G1 lives."""
    AUTO = C.KVT_MEMORY_AUTO
    HOST = C.KVT_MEMORY_HOST
    CUDA = C.KVT_MEMORY_CUDA


class IoEngine(enum.IntEnum):
    """kvt_io_engine: how G3's file is read and written."""
    AUTO = C.KVT_IO_AUTO
    URING = C.KVT_IO_URING
    THREADS = C.KVT_IO_THREADS


class CudaCopy(enum.IntEnum):
    """kvt_cuda_copy: how the CUDA engine copies a batch's chunks."""
    BATCHED = C.KVT_CUDA_COPY_BATCHED
    PER_CHUNK = C.KVT_CUDA_COPY_PER_CHUNK
    KERNEL = C.KVT_CUDA_COPY_KERNEL
    AUTO = C.KVT_CUDA_COPY_AUTO


class G3Fault(enum.IntEnum):
    """kvt_g3_fault: which G3 operations the config's fault injector fails."""
    OFF = C.KVT_G3_FAULT_OFF
    WRITE = C.KVT_G3_FAULT_WRITE
    READ = C.KVT_G3_FAULT_READ


class G3Mismatch(enum.IntEnum):
    """kvt_g3_mismatch: what create does with a persistent G3 file it cannot read."""
    REFUSE = C.KVT_G3_REFUSE
    RESET = C.KVT_G3_RESET


class Eviction(enum.IntEnum):
    """kvt_eviction: which inactive block a tier evicts first."""
    LRU = C.KVT_EVICT_LRU
    S3FIFO = C.KVT_EVICT_S3FIFO


class KvEventsFormat(enum.IntEnum):
    """kvt_kv_events_format: which vLLM wire format the KV events follow."""
    CURRENT = C.KVT_KV_EVENTS_FORMAT_CURRENT
    ARRAY_V0_11 = C.KVT_KV_EVENTS_FORMAT_ARRAY_V0_11


class Role(enum.IntEnum):
    """kvt_connector_role."""
    SCHEDULER = C.KVT_ROLE_SCHEDULER
    WORKER = C.KVT_ROLE_WORKER
    BOTH = C.KVT_ROLE_BOTH


class OffloadMode(enum.IntEnum):
    """kvt_offload_mode: when a connector stores a request's blocks."""
    EAGER = C.KVT_OFFLOAD_EAGER
    LAZY = C.KVT_OFFLOAD_LAZY


class LogLevel(enum.IntEnum):
    """kvt_log_level of set_log_handler."""
    OFF = C.KVT_LOG_OFF
    ERROR = C.KVT_LOG_ERROR
    WARN = C.KVT_LOG_WARN
    INFO = C.KVT_LOG_INFO
    DEBUG = C.KVT_LOG_DEBUG


# The flat names every earlier version exported, now members of the enums above.
G1, G2, G3, G4 = Tier
XFER_DONE, BLOCK_STORED, BLOCK_REMOVED, EVENTS_DROPPED, TIER_CLEARED = EventType
(SLOT_INITIALIZED, SLOT_ONBOARD_STAGED, SLOT_ONBOARDING, SLOT_PREFILLING, SLOT_DECODING,
 SLOT_SKIPPED_PREFILL, SLOT_SKIPPED_DECODE, SLOT_PREEMPTED, SLOT_FINISHING,
 SLOT_FINISHED) = SlotState
MEMORY_AUTO, MEMORY_HOST, MEMORY_CUDA = MemoryKind
IO_AUTO, IO_URING, IO_THREADS = IoEngine
CUDA_COPY_BATCHED, CUDA_COPY_PER_CHUNK, CUDA_COPY_KERNEL, CUDA_COPY_AUTO = CudaCopy
G3_FAULT_OFF, G3_FAULT_WRITE, G3_FAULT_READ = G3Fault
EVICT_LRU, EVICT_S3FIFO = Eviction
ROLE_SCHEDULER, ROLE_WORKER, ROLE_BOTH = Role
OFFLOAD_EAGER, OFFLOAD_LAZY = OffloadMode
LOG_OFF, LOG_ERROR, LOG_WARN, LOG_INFO, LOG_DEBUG = LogLevel
POLICY_PASS_ALL, POLICY_PRESENCE, POLICY_FREQUENCY = (
    CONST["KVT_POLICY_PASS_ALL"], CONST["KVT_POLICY_PRESENCE"], CONST["KVT_POLICY_FREQUENCY"])
