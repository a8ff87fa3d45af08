"""The config structs as dataclasses: ManagerConfig (kvt_manager_config), ConnectorConfig
(kvt_connector_config) and EndpointConfig (kvt_endpoint_config), every field a caller sets
named and typed, with kvt_*_config_init's defaults; Policy and G1Layout, the values of two
of ManagerConfig's fields."""
import collections
import dataclasses
import os
from typing import Optional, Sequence, Union

from ._enums import (CUDA_COPY_AUTO, EVICT_LRU, G2, G3_FAULT_OFF, IO_AUTO, MEMORY_HOST,
                     OFFLOAD_EAGER, POLICY_PRESENCE, ROLE_BOTH, G3Mismatch, KvEventsFormat,
                     Tier)
from ._errors import _invalid
from ._ffi import C, ffi
from ._hash import hash_salt
from ._util import _cstr

Path = Union[str, bytes, os.PathLike]


class Policy(collections.namedtuple("Policy", "flags min_frequency", defaults=(1,))):
    """An offload filter (kvt_policy): flags of POLICY_PRESENCE and POLICY_FREQUENCY."""

    @classmethod
    def _of(cls, value) -> "Policy":
        """A Policy from a Policy, a (flags, min_frequency) pair or a dict."""
        return cls(**value) if isinstance(value, dict) else cls(*value)


class G1Layout:
    """Engine-owned G1 memory (kvt_g1_layout): chunk (layer, outer) of slot b lives at
    bases[layer * num_outer + outer] + b * strides[same index].

    Each base is an object with the buffer protocol (bytearray, writable memoryview, mmap,
    array, numpy array: kvtier writes into it when it onboards), or an (address, length)
    pair of ints for memory Python does not own (CUDA memory, for instance). The manager
    checks that each buffer holds every slot, and keeps the buffers alive until it closes."""

    def __init__(self, bases, strides, memory: int = MEMORY_HOST, cuda_device: int = 0):
        if len(bases) != len(strides):
            raise _invalid("g1_layout: %d bases but %d strides" % (len(bases), len(strides)))
        self.bases, self.strides = list(bases), list(strides)
        self.memory, self.cuda_device = memory, cuda_device

    def _cdata(self, cfg):
        """(kvt_g1_layout *, the cdata objects that must outlive the manager). cfg: anything
        with num_layers, num_outer, chunk_bytes and g1_blocks."""
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


def _fill(struct, config, keep: list, what: str, number=None) -> None:
    """Sets each field of a C config struct from the same-named field of a config dataclass:
    strings as NUL-terminated copies appended to keep (the library borrows them during the
    call), policies from Policy, arrays from sequences, integers through number() when
    given. Pointers to structs (g1_layout) are left to the caller. A value C cannot take is
    an InvalidArgumentError naming the field."""
    ctypes = dict(ffi.typeof(struct).item.fields)
    for f in dataclasses.fields(config):
        v, t = getattr(config, f.name), ctypes[f.name].type
        try:
            if t.kind == "pointer":
                if t.item.cname != "char":
                    continue
                v = _cstr(v, keep)
            elif t.cname == "kvt_policy":
                v = Policy._of(v)._asdict()
            elif number is not None and t.kind == "primitive":
                v = number(v)
            setattr(struct, f.name, v)
        except (IndexError, OverflowError, TypeError, ValueError) as e:
            raise _invalid("%s %s: %s" % (what, f.name, e)) from None


def _merged(cls, config, fields: dict, what: str):
    """config (None: cls's defaults) with fields replaced by name."""
    if config is None:
        config = cls()
    elif not isinstance(config, cls):
        raise _invalid("%s must be a kvtier.%s, not %s" % (what, cls.__name__,
                                                           type(config).__name__))
    unknown = sorted(set(fields) - {f.name for f in dataclasses.fields(cls)})
    if unknown:
        raise _invalid("unknown %s field %r" % (what, unknown[0]))
    return dataclasses.replace(config, **fields)


_PASS_PRESENT = Policy(POLICY_PRESENCE)


@dataclasses.dataclass
class ManagerConfig:
    """kvt_manager_config: a manager's tiers, pipeline, G3 file, KV events and G4. Every
    field but struct_size and reserved, with kvt_manager_config_init's defaults except
    g1_memory: library-owned G1 is host memory here unless asked otherwise. Strings (paths,
    endpoints, URLs, names of environment variables) are str, bytes or os.PathLike; None is
    the C NULL. kvtier.h documents each field's range."""
    # Shape and capacities.
    page_size: int = 16              # tokens per block, a power of two in 1..65536
    num_layers: int = 1
    num_outer: int = 2               # 2: separate K and V; 1: fused K/V or MLA
    chunk_bytes: int = 4096          # one (layer, outer) chunk of one block; 0: metadata only
    g1_blocks: int = 1024
    g2_blocks: int = 4096            # 0: no G2
    g3_blocks: int = 0               # 0: no G3
    g3_path: Optional[Path] = None   # G3's directory; None: a temporary one
    event_capacity: int = 65536      # bound of the event queue (Manager.poll)
    g1_layout: Optional[G1Layout] = None  # engine-owned G1 memory; None: the library's
    g1_memory: int = MEMORY_HOST     # MemoryKind of library-owned G1 (C's default: AUTO)
    cuda_device: int = 0             # for library-owned G1 in CUDA memory
    # The offload pipeline.
    max_batch_size: int = 64         # blocks per transfer batch
    min_batch_size: int = 8          # blocks that flush a batch early when the executor idles
    flush_interval_us: int = 10000   # a partial batch waits at most this long
    policy_timeout_us: int = 100000  # policy evaluation of one container may take this long
    sweep_interval_us: int = 10000   # how often CUDA events are polled
    max_concurrent_transfers: int = 1  # batches in flight at once
    copy_threads: int = 4            # threads splitting host copies and doing G3's I/O
    policy_g1_g2: Policy = _PASS_PRESENT  # offload filters per tier pair: a Policy, a
    policy_g1_g3: Policy = _PASS_PRESENT  # (flags, min_frequency) pair or a dict
    policy_g2_g3: Policy = _PASS_PRESENT
    g3_io: int = IO_AUTO             # IoEngine
    cuda_copy: int = CUDA_COPY_AUTO  # CudaCopy
    # G3 fault injection, for tests: of the G3 operations of kind g3_fault_op, the first
    # g3_fault_skip pass, the next g3_fault_count fail with errno g3_fault_errno.
    g3_fault_op: int = G3_FAULT_OFF  # G3Fault
    g3_fault_errno: int = 0
    g3_fault_skip: int = 0
    g3_fault_count: int = 0
    # A G3 that outlives the manager (docs/G3_FORMAT.md).
    g3_persist: bool = False         # keep g3_path/kvtier-g3.bin and recover it at create
    g3_on_mismatch: int = G3Mismatch.REFUSE  # a persistent file of another layout
    g3_namespace: int = 0            # a persistent file's owner tag
    # Eviction.
    eviction: Sequence[int] = (EVICT_LRU,) * 3  # Eviction of G1, G2, G3
    max_pinned_percent: int = 50     # share of a tier pinned blocks may hold
    # KV events in vLLM's ZMQ wire format (docs/KV_EVENTS.md).
    kv_events_endpoint: Optional[str] = None  # the PUB socket's endpoint; None: no publisher
    kv_events_replay_endpoint: Optional[str] = None  # a ROUTER answering replay requests
    kv_events_topic: Optional[str] = None  # the first frame of each message; None: ""
    kv_events_buffer: int = 10000    # batches kept for replay
    kv_events_dp_rank: int = 0       # data_parallel_rank of every batch
    kv_events_tiers: int = (1 << Tier.G1) | (1 << Tier.G2) | (1 << Tier.G3)  # bit 1 << tier
    # G4, a tier on Redis shared by many managers (docs/G4.md).
    g4_url: Optional[str] = None     # "redis://host:port[/db]", "unix:///path", shards
    g4_password_env: Optional[str] = None  # the name of the variable holding the password
    g4_key_prefix: Optional[str] = None  # of every key; None: "kvtier"
    g4_namespace: int = 0            # in every key, e.g. the model's salt hash
    g4_timeout_us: int = 1000000     # connect and command timeout
    kv_events_format: int = KvEventsFormat.CURRENT  # which vLLM's wire format
    g4_key_env: Optional[str] = None  # the variable holding G4's MAC key (64 hex digits)
    g3_key_env: Optional[str] = None  # the variable holding G3's MAC key (64 hex digits)

    def _cdata(self):
        """(kvt_manager_config *, the cdata objects that must outlive the manager: the
        strings until create returns, G1's buffers until it closes)."""
        cfg = ffi.new("kvt_manager_config *")
        C.kvt_manager_config_init_sized(cfg, ffi.sizeof("kvt_manager_config"))
        keep = [cfg]
        _fill(cfg, self, keep, "config")
        if self.g1_layout is not None:
            layout, held = self.g1_layout._cdata(cfg)
            cfg.g1_layout = layout
            keep += held
        return cfg, keep


@dataclasses.dataclass
class ConnectorConfig:
    """kvt_connector_config: a connector's role and offload, and its parallelism and
    window. Every field but struct_size and reserved*, with kvt_connector_config_init's
    defaults."""
    role: int = ROLE_BOTH            # Role
    offload: int = OFFLOAD_EAGER     # OffloadMode
    store_tier: int = G2             # where stores go: G2 or G3
    num_gpu_blocks: int = 0          # G1 block ids are 0..num_gpu_blocks-1; 0: g1_blocks
    salt_hash: int = hash_salt(b"")  # of the requests' block hashes: the empty salt's
    load_async: bool = False         # loads end in finished_recving, not within the step
    endpoint_path: Optional[Path] = None  # serve the management endpoint there
    pause_timeout_ms: int = 30000    # a breakpoint's pause ends itself after this long
    world_size: int = 1              # worker halves (tensor and pipeline parallel ranks)
    rank: int = 0                    # a worker half's rank
    sliding_window: int = 0          # tokens of a sliding-window group; 0: full attention

    def _cdata(self):
        """(kvt_connector_config *, the strings it borrows until create returns)."""
        cfg = ffi.new("kvt_connector_config *")
        C.kvt_connector_config_init_sized(cfg, ffi.sizeof("kvt_connector_config"))
        keep = [cfg]
        _fill(cfg, self, keep, "connector config", number=int)
        return cfg, keep


@dataclasses.dataclass
class EndpointConfig:
    """kvt_endpoint_config: whom the management endpoint admits and what a client may cost
    (docs/SECURITY.md), with kvt_endpoint_config_init's defaults."""
    max_clients: int = 64            # clients served at once, 1..4096
    allow_uid: int = -1              # a user allowed besides the process's and root; -1: none
    allow_gid: int = -1              # a group allowed; -1: none
    client_buffer_bytes: int = 256 << 10  # replies held for a client before its requests wait

    def _cdata(self):
        cfg = ffi.new("kvt_endpoint_config *")
        C.kvt_endpoint_config_init_sized(cfg, ffi.sizeof("kvt_endpoint_config"))
        keep = [cfg]
        _fill(cfg, self, keep, "endpoint config")
        return cfg, keep


# Every field name of kvt_manager_config (kvtier.vllm checks a user's manager dict with it).
_CONFIG_FIELDS = frozenset(name for name, _ in ffi.typeof("kvt_manager_config").fields)
