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
passed without a copy. Arrays out: lists of ints. Every error is a kvtier.Error subclass with
.status and the library's message; kvtier.CancelledError marks a cancelled transfer. Codes
are IntEnums (Tier, BlockState, EventType, SlotState, ...), results typed dataclasses
(TierStats, Event, ObsEvent, ...) that also read like dicts.

Manager(config, **fields) takes a ManagerConfig, every field of kvt_manager_config, and any
of them by name; G1Layout is engine-owned G1 memory (any writable buffer, or an (address,
length) pair). set_log_handler sends the library's diagnostics to a logging.Logger or a
callable. Subscription, EventLog and replay_log read the observe stream (docs/EVENTS.md),
Endpoint serves the management socket.

Connector(manager, config, **fields) is the request layer (kvt_connector_*) with vLLM's
method names (see kvtier/connector.py); kvtier.vllm plugs it into vLLM by module path.

The modules: _errors (Error and one class per status), _enums, _config (the config
dataclasses, Policy, G1Layout), _hash, _manager (Manager, its stats and events), _transfer
(Transfer, Fence), _observe, _endpoint, _library (version, logging), connector.
"""
from ._cdef import CONST  # noqa: F401 (the header's #defines, for kvtier.vllm and tests)
from ._config import _CONFIG_FIELDS  # noqa: F401 (kvtier.vllm checks its manager dict)
from ._config import ConnectorConfig, EndpointConfig, G1Layout, ManagerConfig, Policy
from ._endpoint import Endpoint, EndpointStats
from ._enums import (BLOCK_REMOVED, BLOCK_STORED, CUDA_COPY_AUTO, CUDA_COPY_BATCHED,
                     CUDA_COPY_KERNEL, CUDA_COPY_PER_CHUNK, EVENTS_DROPPED, EVICT_LRU,
                     EVICT_S3FIFO, G1, G2, G3, G3_FAULT_OFF, G3_FAULT_READ, G3_FAULT_WRITE, G4,
                     IO_AUTO, IO_THREADS, IO_URING, LOG_DEBUG, LOG_ERROR, LOG_INFO, LOG_OFF,
                     LOG_WARN, MEMORY_AUTO, MEMORY_CUDA, MEMORY_HOST, POLICY_FREQUENCY,
                     POLICY_PASS_ALL, POLICY_PRESENCE, TIER_CLEARED, XFER_DONE, BlockState,
                     CandidateState, CudaCopy, EventType, Eviction, G3Fault, G3Mismatch,
                     IoEngine, KvEventsFormat, LogLevel, MemoryKind, ObsKind, ObsTrigger,
                     OffloadMode, Role, SlotState, Tier, XferState)
from ._errors import (OK, CancelledError, CorruptError, CudaError, Error, InternalError,
                      InvalidArgumentError, InvalidHandleError, IoError, NoMemoryError,
                      NoSpaceError, NotFoundError, StateError, TimeoutError, UnsupportedError)
from ._ffi import C, ffi  # noqa: F401 (the raw library, for what the binding lacks)
from ._hash import Seq, hash_salt, hash_sequence
from ._library import set_log_handler, version
from ._manager import BlockInfo, Event, G4Stats, Manager, TierStats, TransferStats
from ._observe import (EventLog, LogReplay, ObsEvent, Subscription, candidate_state_str,
                       obs_kind_str, obs_trigger_str, replay_log)
from ._transfer import Fence, Transfer
from .connector import (BLOCK_ID_NONE, OFFLOAD_EAGER, OFFLOAD_LAZY, ROLE_BOTH, ROLE_SCHEDULER,
                        ROLE_WORKER, SLOT_DECODING, SLOT_FINISHED, SLOT_FINISHING,
                        SLOT_INITIALIZED, SLOT_ONBOARD_STAGED, SLOT_ONBOARDING, SLOT_PREEMPTED,
                        SLOT_PREFILLING, SLOT_SKIPPED_DECODE, SLOT_SKIPPED_PREFILL, BatchInfo,
                        Connector, ConnectorStats, Finished, PauseInfo, ScheduledRequest,
                        SlotInfo, slot_state_str)

__all__ = [
    # objects
    "Manager", "Transfer", "Fence", "Seq", "Connector", "Subscription", "EventLog", "Endpoint",
    # configs and their values
    "ManagerConfig", "ConnectorConfig", "EndpointConfig", "G1Layout", "Policy",
    # results
    "Event", "ObsEvent", "TierStats", "TransferStats", "BlockInfo", "G4Stats", "LogReplay",
    "EndpointStats", "ConnectorStats", "SlotInfo", "BatchInfo", "PauseInfo", "Finished",
    "ScheduledRequest",
    # codes
    "Tier", "BlockState", "XferState", "EventType", "SlotState", "CandidateState",
    "ObsTrigger", "ObsKind", "MemoryKind", "IoEngine", "CudaCopy", "G3Fault", "G3Mismatch",
    "Eviction", "KvEventsFormat", "Role", "OffloadMode", "LogLevel",
    "G1", "G2", "G3", "G4", "XFER_DONE", "BLOCK_STORED", "BLOCK_REMOVED", "EVENTS_DROPPED",
    "TIER_CLEARED", "SLOT_INITIALIZED", "SLOT_ONBOARD_STAGED", "SLOT_ONBOARDING",
    "SLOT_PREFILLING", "SLOT_DECODING", "SLOT_SKIPPED_PREFILL", "SLOT_SKIPPED_DECODE",
    "SLOT_PREEMPTED", "SLOT_FINISHING", "SLOT_FINISHED", "MEMORY_AUTO", "MEMORY_HOST",
    "MEMORY_CUDA", "IO_AUTO", "IO_URING", "IO_THREADS", "CUDA_COPY_BATCHED",
    "CUDA_COPY_PER_CHUNK", "CUDA_COPY_KERNEL", "CUDA_COPY_AUTO", "G3_FAULT_OFF",
    "G3_FAULT_WRITE", "G3_FAULT_READ", "EVICT_LRU", "EVICT_S3FIFO", "ROLE_SCHEDULER",
    "ROLE_WORKER", "ROLE_BOTH", "OFFLOAD_EAGER", "OFFLOAD_LAZY", "LOG_OFF", "LOG_ERROR",
    "LOG_WARN", "LOG_INFO", "LOG_DEBUG", "POLICY_PASS_ALL", "POLICY_PRESENCE",
    "POLICY_FREQUENCY", "BLOCK_ID_NONE", "OK",
    # errors
    "Error", "InvalidArgumentError", "InvalidHandleError", "StateError", "NoSpaceError",
    "CancelledError", "UnsupportedError", "IoError", "CorruptError", "NoMemoryError",
    "CudaError", "InternalError", "TimeoutError", "NotFoundError",
    # functions
    "hash_salt", "hash_sequence", "version", "set_log_handler", "slot_state_str",
    "obs_kind_str", "candidate_state_str", "obs_trigger_str", "replay_log",
]
