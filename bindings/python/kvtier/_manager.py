"""The manager (kvt_manager): its blocks, tiers, transfers, events, recorder and G4."""
import dataclasses
import os
from typing import Iterator, List, Optional, Union

from ._config import ManagerConfig, _merged
from ._enums import G1, BlockState, EventType, Tier
from ._errors import _check, _invalid, _raise
from ._ffi import C, ffi
from ._hash import Salt, _salt_hash
from ._observe import Subscription
from ._transfer import Fence, Transfer
from ._util import (_NO_HANDLE, _SCRATCH, _Handle, _path, _readable, _Record, _scratch, _to_list,
                    _u32_array, _u64_array, _versioned)

PathLike = Union[str, bytes, os.PathLike]


@dataclasses.dataclass(frozen=True)
class Event(_Record):
    """A manager event (kvt_event), from Manager.poll or Connector.take_events."""
    _ctype = "kvt_event"
    _enums = {"type": EventType, "tier": Tier}

    type: int
    status: int
    tier: int
    user_data: int
    hash: int
    parent_hash: int
    count: int


@dataclasses.dataclass(frozen=True)
class TierStats(_Record):
    """kvt_tier_stats: a snapshot of one tier (free + active + inactive + retired =
    capacity)."""
    _ctype = "kvt_tier_stats"

    memory: int
    capacity: int
    free: int
    active: int
    inactive: int
    registered: int
    block_bytes: int
    metadata_bytes: int
    allocs: int
    evictions: int
    registrations: int
    dedups: int
    match_queried: int
    match_hit: int
    retired: int
    recovered: int
    pinned: int


@dataclasses.dataclass(frozen=True)
class TransferStats(_Record):
    """kvt_transfer_stats: the counters of one direction since the manager's creation."""
    _ctype = "kvt_transfer_stats"

    completed: int
    cancelled: int
    failed: int
    blocks: int
    bytes: int
    busy_ns: int


@dataclasses.dataclass(frozen=True)
class BlockInfo(_Record):
    """kvt_block_info: a snapshot of one block."""
    _ctype = "kvt_block_info"
    _enums = {"state": BlockState, "tier": Tier}

    state: int
    tier: int
    refs: int
    tokens: int
    seq_hash: int
    parent_hash: int


@dataclasses.dataclass(frozen=True)
class G4Stats(_Record):
    """kvt_g4_stats: G4's counters (docs/G4.md)."""
    _ctype = "kvt_g4_stats"

    shards: int
    lookups: int
    hits: int
    stored_blocks: int
    loaded_blocks: int
    missing_blocks: int
    corrupt_blocks: int
    failed_blocks: int
    bytes_written: int
    bytes_read: int
    round_trips: int
    reconnects: int
    redirects: int
    slot_map_reads: int


class Manager(_Handle):
    """Owns a kvt_manager. Use as a context manager, or call close(). Calls from several
    threads at once are fine: the library is thread-safe and cffi releases the GIL. close()
    from one thread while others call: the calls in flight end first (their results stand),
    later ones raise InvalidHandleError."""
    _closed_message = "the manager is closed"

    def __init__(self, config: Optional[ManagerConfig] = None, **fields):
        """config: a ManagerConfig; fields: any of its fields by name, over config
        (page_size=16, g2_blocks=0, policy_g1_g2=Policy(POLICY_FREQUENCY, 2),
        g3_io=IO_THREADS, g1_layout=G1Layout(...), kv_events_endpoint="tcp://*:5557", ...);
        the others keep ManagerConfig's defaults. A path in config's place is g3_path, as
        Manager(g3_path, **fields) was before 0.5.0."""
        if isinstance(config, (str, bytes, os.PathLike)):
            fields = {"g3_path": config, **fields}
            config = None
        cfg = _merged(ManagerConfig, config, fields, "config")
        c, keep = cfg._cdata()
        out = ffi.new("kvt_manager **")
        _check(C.kvt_manager_create(out, c))
        self._keep = keep  # G1's buffers among them: the library uses them until close
        self._transfers = set()
        self._endpoints = set()  # closed before the manager, as kvt_endpoint_close requires
        self._connector = None  # at most one (kvt_connector_create): closed before the manager
        self._shape = (c.num_layers, c.num_outer, c.chunk_bytes)  # for a connector's G1
        self._page_size = c.page_size
        self._own(out[0])

    def _close_first(self) -> None:
        for x in list(self._transfers):  # cancels them, and waits for their waiters
            x.close()
        for e in list(self._endpoints):
            e.close()
        if self._connector is not None:
            self._connector.close()

    def _free(self, m) -> None:
        C.kvt_manager_destroy(m)
        self._keep = None

    # blocks
    def alloc(self, n: int, tier: int = G1) -> List[int]:
        out = ffi.new("kvt_block[]", max(n, 1))
        with self._using() as m:
            _check(C.kvt_block_alloc(out, n, m, tier))
        return _to_list(out, n)

    def release(self, blocks) -> None:
        arr, n = _u64_array(blocks, "blocks")
        with self._using() as m:
            _check(C.kvt_block_release(m, arr, n))

    def retain(self, block: int) -> None:
        with self._using() as m:
            _check(C.kvt_block_retain(m, block))

    # priorities and pins: what eviction spares
    def set_priority(self, blocks, priority: int) -> None:
        """Eviction priority of registered blocks, all or none: lower is evicted first (0 by
        default), the tier's policy orders equals."""
        if not -2**31 <= priority < 2**31:
            raise _invalid("priority %d is not a 32-bit integer" % priority)
        arr, n = _u64_array(blocks, "blocks")
        with self._using() as m:
            _check(C.kvt_block_set_priority(m, arr, n, priority))

    def pin(self, blocks) -> None:
        """Registered blocks that eviction never takes, all or none: NoSpaceError past the
        tier's max_pinned_percent."""
        arr, n = _u64_array(blocks, "blocks")
        with self._using() as m:
            _check(C.kvt_block_pin(m, arr, n))

    def unpin(self, blocks) -> None:
        arr, n = _u64_array(blocks, "blocks")
        with self._using() as m:
            _check(C.kvt_block_unpin(m, arr, n))

    def evictable(self, max_blocks: Optional[int] = None, tier: int = G1) -> List[int]:
        """The inactive blocks in the order the tier would evict them: the first max_blocks
        of them, or all (None)."""
        n = ffi.new("size_t *")
        with self._using() as m:
            if max_blocks is None:  # how many there are now, then room for them
                _check(C.kvt_tier_evictable_blocks(ffi.NULL, 0, n, m, tier))
            while True:
                cap = n[0] if max_blocks is None else max_blocks
                out = ffi.new("kvt_block[]", max(cap, 1))
                _check(C.kvt_tier_evictable_blocks(out, cap, n, m, tier))
                if max_blocks is not None or n[0] <= cap:  # else more came meanwhile
                    return _to_list(out, min(n[0], cap))

    # the hash path: the engine computed the hash
    def register_hash(self, block: int, seq_hash: int, parent: int = 0) -> int:
        out = ffi.new("kvt_block *")
        with self._using() as m:
            _check(C.kvt_block_register_hash(out, m, block, seq_hash, parent))
        return out[0]

    def register_hashes(self, blocks, seq_hashes, parent: int = 0) -> List[int]:
        b, n = _u64_array(blocks, "blocks")
        h, nh = _u64_array(seq_hashes, "seq_hashes")
        if n != nh:
            raise _invalid("%d blocks but %d hashes" % (n, nh))
        out = ffi.new("kvt_block[]", max(n, 1))
        with self._using() as m:
            _check(C.kvt_block_register_hashes(out, m, b, h, n, parent))
        return _to_list(out, n)

    # the token path: kvtier computes the hash (kvtier.h, "Blocks: states and references")
    def block_init(self, block: int, salt: Salt = b"", parent: int = 0) -> None:
        """EMPTY -> PARTIAL: the block of a sequence under salt (or its hash), after the block
        whose sequence hash is parent (0 for a first block)."""
        with self._using() as m:
            _check(C.kvt_block_init(m, block, _salt_hash(salt), parent))

    def block_append(self, block: int, tokens) -> None:
        """PARTIAL or READY -> READY: stages tokens (at most the room left in the block)."""
        toks, n = _u32_array(tokens)
        with self._using() as m:
            _check(C.kvt_block_append(m, block, toks, n))

    def block_schedule(self, block: int) -> None:
        """READY -> INFLIGHT."""
        with self._using() as m:
            _check(C.kvt_block_schedule(m, block))

    def block_unschedule(self, block: int) -> None:
        """READY -> PARTIAL, its tokens kept."""
        with self._using() as m:
            _check(C.kvt_block_unschedule(m, block))

    def block_compute_done(self, block: int) -> None:
        """INFLIGHT -> COMPLETE when the block holds page_size tokens, else PARTIAL."""
        with self._using() as m:
            _check(C.kvt_block_compute_done(m, block))

    def block_register(self, block: int) -> int:
        """COMPLETE -> REGISTERED under the chained hash of its tokens; the registered block
        (another one when the hash was registered already: dedup, as register_hash)."""
        out = ffi.new("kvt_block *")
        with self._using() as m:
            _check(C.kvt_block_register(out, m, block))
        return out[0]

    def match_prefix(self, seq_hashes, tier: int = G1) -> List[int]:
        """The pinned blocks of the longest registered prefix, as a list."""
        g = self._gate  # _using(), inline: this is the call an engine makes most
        g.calls.append(None)
        try:
            if g.shut:
                raise g.closed_error()
            if type(seq_hashes) is list and len(seq_hashes) <= _SCRATCH:
                h, out, got = _scratch()
                n = len(seq_hashes)
                try:
                    h[0:n] = seq_hashes
                except (OverflowError, TypeError) as e:
                    raise _invalid("seq_hashes: %s" % e) from None
            else:
                h, n = _u64_array(seq_hashes, "seq_hashes")
                out, got = ffi.new("kvt_block[]", max(n, 1)), ffi.new("size_t *")
            st = C.kvt_tier_match_prefix(got, out, g.h, tier, h, n)
        finally:
            g.calls.pop()
            if g.shut:
                g.wake()
        if st:
            _raise(st)
        return ffi.unpack(out, got[0])

    def block_data(self, block: int) -> memoryview:
        """A writable memoryview of the block's bytes, valid while a reference is held."""
        p, n = ffi.new("void **"), ffi.new("size_t *")
        with self._using() as m:
            _check(C.kvt_block_data(p, n, m, block))
        return memoryview(ffi.buffer(p[0], n[0])) if n[0] else memoryview(b"")

    def block_info(self, block: int) -> BlockInfo:
        info = _versioned("kvt_block_info")
        with self._using() as m:
            _check(C.kvt_block_info_get(info, m, block))
        return BlockInfo._from_c(info)

    def block_chunk(self, block: int, layer: int, outer: int) -> int:
        """The address of chunk (layer, outer) of a block, as an int (a device address for
        CUDA memory); chunk_bytes long, valid while a reference to the block is held."""
        p = ffi.new("void **")
        with self._using() as m:
            _check(C.kvt_block_chunk(p, m, block, layer, outer))
        return int(ffi.cast("uintptr_t", p[0]))

    def tier_stats(self, tier: int = G1) -> TierStats:
        s = _versioned("kvt_tier_stats")
        with self._using() as m:
            _check(C.kvt_tier_stats_get(s, m, tier))
        return TierStats._from_c(s)

    def transfer_stats(self, src: int, dst: int) -> TransferStats:
        """The counters of one direction (G1 -> G2, ..., G3 -> G1, to and from G4) since
        creation."""
        s = _versioned("kvt_transfer_stats")
        with self._using() as m:
            _check(C.kvt_transfer_stats_get(s, m, src, dst))
        return TransferStats._from_c(s)

    def check(self) -> None:
        with self._using() as m:
            _check(C.kvt_manager_check(m))

    # observe (docs/EVENTS.md)
    def subscribe(self, capacity: int = 65536) -> Subscription:
        return Subscription(self, capacity)

    def record(self, path: PathLike) -> None:
        """Appends every event from now on to a new event log at path."""
        with self._using() as m:
            _check(C.kvt_manager_recorder_open(m, _path(path)))

    def stop_recording(self) -> None:
        with self._using() as m:
            _check(C.kvt_manager_recorder_close(m))

    def record_ring(self, events: int) -> None:
        """Keeps the last `events` events in memory (0: none), for dump_ring."""
        with self._using() as m:
            _check(C.kvt_manager_recorder_ring(m, events))

    def dump_ring(self, path: PathLike) -> None:
        """Writes the ring's events to a new event log at path (EventLog reads it)."""
        with self._using() as m:
            _check(C.kvt_manager_recorder_dump(m, _path(path)))

    def metrics_text(self, connector=None) -> str:
        """Prometheus text of the counters (and of the connector's slots, when given)."""
        n = ffi.new("size_t *")
        with self._using() as m, \
                (connector._using() if connector is not None else _NO_HANDLE) as c:
            C.kvt_metrics_text(ffi.NULL, 0, n, m, c)
            buf = ffi.new("char[]", n[0] + 4096)
            _check(C.kvt_metrics_text(buf, len(buf), n, m, c))
        return ffi.string(buf, n[0]).decode()

    def tier_hashes(self, tier: int = G1) -> List[int]:
        """The hashes the tier holds registered now."""
        n = ffi.new("size_t *")
        with self._using() as m:
            _check(C.kvt_tier_hashes(ffi.NULL, 0, n, m, tier))
            buf = ffi.new("uint64_t[]", n[0])
            _check(C.kvt_tier_hashes(buf, n[0], n, m, tier))
        return list(buf[0:min(n[0], len(buf))])

    def reset(self, tier: int = 0) -> None:
        """Empties one tier's registry, or every tier's (0): transfers not yet committed that
        touch it end cancelled, copies in flight are waited for; blocks still held stay
        readable until released. Events: BLOCK_REMOVED per block, then TIER_CLEARED."""
        with self._using() as m:
            _check(C.kvt_manager_reset(m, tier))

    # KV events (kvtier.h, "KV events")
    def note_tokens(self, seq_hashes, tokens) -> None:
        """The tokens of full blocks, for the BlockStored events the KV events publisher
        sends: tokens[i * page_size:(i + 1) * page_size] are those of seq_hashes[i]. Note
        them before the blocks are registered; a no-op without a publisher."""
        h, n = _u64_array(seq_hashes, "seq_hashes")
        toks, nt = _u32_array(tokens)
        if nt != n * self._page_size:
            raise _invalid("%d tokens for %d blocks of %d" % (nt, n, self._page_size))
        with self._using() as m:
            _check(C.kvt_manager_note_tokens(m, h, n, toks))

    # transfers
    def offload(self, blocks, dst: int, fence: Optional[Fence] = None,
                user_data: int = 0) -> Transfer:
        """Copies registered blocks of one tier to the lower tier dst (G2, G3, or G4)."""
        b, n = _u64_array(blocks, "blocks")
        out = ffi.new("kvt_xfer **")
        with self._using() as m:
            _check(C.kvt_xfer_offload(out, m, b, n, dst, self._fence(fence), user_data))
            return Transfer(self, out[0], n)

    def onboard(self, src, dst_g1, fence: Optional[Fence] = None,
                user_data: int = 0) -> Transfer:
        s, n = _u64_array(src, "src")
        d, nd = _u64_array(dst_g1, "dst_g1")
        if n != nd:
            raise _invalid("%d sources but %d destinations" % (n, nd))
        out = ffi.new("kvt_xfer **")
        with self._using() as m:
            _check(C.kvt_xfer_onboard(out, m, s, d, n, self._fence(fence), user_data))
            return Transfer(self, out[0], n)

    def fence(self) -> Fence:
        out = ffi.new("kvt_fence **")
        with self._using() as m:
            _check(C.kvt_fence_create(out, m))
            return Fence(self, out[0])

    def fence_from_cuda_event(self, cuda_event: int) -> Fence:
        """A fence signalled when a CUDA event (a cudaEvent_t, as an int: torch's
        Event.cuda_event) recorded on the host's stream has completed; the event must live
        until then. UnsupportedError without CUDA."""
        out = ffi.new("kvt_fence **")
        with self._using() as m:
            _check(C.kvt_fence_from_cuda_event(out, m, ffi.cast("void *", cuda_event)))
            return Fence(self, out[0])

    def _fence(self, fence):
        if fence is None:
            return ffi.NULL
        if not isinstance(fence, Fence):
            raise _invalid("fence must be a kvtier.Fence, not %s" % type(fence).__name__)
        return fence._live()

    # G4 (docs/G4.md)
    def g4_match(self, seq_hashes) -> int:
        """The length of the longest prefix of seq_hashes that G4 holds. Blocks for up to
        g4_timeout_us; IoError when Redis cannot be reached."""
        h, n = _u64_array(seq_hashes, "seq_hashes")
        out = ffi.new("size_t *")
        with self._using() as m:
            _check(C.kvt_g4_match(out, m, h, n))
        return out[0]

    def g4_onboard(self, seq_hashes, dst, parent: int = 0, fence: Optional[Fence] = None,
                   user_data: int = 0) -> Transfer:
        """Copies the G4 values of a chain of hashes (the first one's parent is parent) into
        dst, Empty blocks of G1 or G2, and registers them. The transfer ends with
        NotFoundError, CorruptError or IoError at the first block it cannot have."""
        h, n = _u64_array(seq_hashes, "seq_hashes")
        d, nd = _u64_array(dst, "dst")
        if n != nd:
            raise _invalid("%d hashes but %d destinations" % (n, nd))
        out = ffi.new("kvt_xfer **")
        with self._using() as m:
            _check(C.kvt_g4_onboard(out, m, h, n, parent, d, self._fence(fence),
                                    user_data))
            return Transfer(self, out[0], n)

    def g4_stats(self) -> G4Stats:
        s = _versioned("kvt_g4_stats")
        with self._using() as m:
            _check(C.kvt_g4_stats_get(s, m))
        return G4Stats._from_c(s)

    # events
    def poll(self, max_events: int = 256) -> List[Event]:
        buf = ffi.new("kvt_event[]", max_events)
        with self._using() as m:
            n = C.kvt_manager_poll(m, buf, max_events)
        return [Event._from_c(e) for e in buf[0:n]]

    def events(self) -> Iterator[Event]:
        """Drains the pending events, oldest first."""
        while True:
            batch = self.poll()
            if not batch:
                return
            yield from batch

    def fileno(self) -> int:
        """The event fd: readable while events are pending (select, poll, asyncio)."""
        with self._using() as m:
            return C.kvt_manager_event_fd(m)

    async def poll_async(self, max_events: int = 256,
                         timeout: Optional[float] = None) -> List[Event]:
        """Waits on the event fd in the running asyncio loop until events are pending, then
        polls them. asyncio.TimeoutError when none came within timeout seconds."""
        while True:
            batch = self.poll(max_events)
            if batch:
                return batch
            await _readable(self.fileno(), timeout)

    next_events = poll_async  # the name earlier versions gave it

