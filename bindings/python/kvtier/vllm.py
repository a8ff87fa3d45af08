"""kvtier as a vLLM KV connector (KVConnectorBase_V1), loaded by module path:

    vllm serve MODEL --kv-transfer-config '{
        "kv_connector": "KvtierConnector", "kv_connector_module_path": "kvtier.vllm",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"g2_blocks": 65536, "offload": "eager"}}'

The scheduler process gets a SCHEDULER connector over a manager that holds G2/G3 registries
but no KV (chunk_bytes 0); each worker gets a WORKER connector over a manager whose G2/G3
memory holds the KV, created in register_kv_caches once the KV tensors' layout is known.
The step's metadata (KvtierConnectorMetadata) and the worker's report
(KvtierWorkerMetadata, in KVConnectorOutput.kv_connector_worker_meta) carry kvtier's bytes.

Checked against vLLM's source at upstream main 0231dd5 (docs/VLLM.md): its scheduler's
asserts on finished_recving / finished_sending, async scheduling's placeholders, speculative
drafts, reset_prefix_cache, and its block identity (cache_salt, LoRA, multimodal inputs).

kv_connector_extra_config keys (docs/VLLM.md):
  g2_blocks, g3_blocks   capacities of G2 (host memory) and G3 (a file), in blocks (default 0)
  g3_path                directory of the G3 file (of a worker of world_size N > 1: its
                         subdirectory rank-<r>-of-<N>, created if need be)
  store_tier             "G2" (default) or "G3": where stores go
  offload                "eager" (default) or "lazy"; lazy_offload (bool), as in vLLM's
                         SimpleCPUOffloadConnector, is accepted too
  load_async             true: loads end between steps (finished_recving); default false
  salt                   a str folded into every block's name (default none)
  num_gpu_blocks         G1 blocks when no kv_cache_config is given
  manager                a dict of further kvt_manager_config fields (g3_io, policies, ...)
  cross_layer_blocks     true: ask vLLM for one tensor whose blocks hold every layer (a copy
                         per block, no overlap with the forward); default false: per-layer
                         tensors, copied layer by layer behind the forward

vLLM's base classes are imported when vLLM is installed; otherwise minimal stand-ins let this
module import (and its non-vLLM parts be used) without it.
"""
import collections
import dataclasses
import enum
import json
import math
import os

import kvtier
from kvtier import _vllm_layout

try:
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (
        KVConnectorBase_V1, KVConnectorMetadata, KVConnectorRole, KVConnectorWorkerMetadata,
        SupportsHMA)
except ImportError:
    class SupportsHMA:
        """Stand-in: a connector that serves vLLM's hybrid KV cache manager (several KV
        cache groups) through request_finished_all_groups."""

    class KVConnectorRole(enum.Enum):
        """Stand-in of vllm...kv_connector.v1.base.KVConnectorRole."""
        SCHEDULER = 0
        WORKER = 1

    class KVConnectorMetadata:
        """Stand-in: what the scheduler's connector sends its workers each step."""

    class KVConnectorWorkerMetadata:
        """Stand-in: what a worker's connector sends back each step."""

        def aggregate(self, other):
            raise NotImplementedError

    class KVConnectorBase_V1:
        """Stand-in of the part of vLLM's base class KvtierConnector relies on."""

        def __init__(self, vllm_config, role, kv_cache_config=None):
            if vllm_config.kv_transfer_config is None:
                raise ValueError("kv_transfer_config must be set for KVConnectorBase_V1")
            self._connector_metadata = None
            self._vllm_config = vllm_config
            self._kv_transfer_config = vllm_config.kv_transfer_config
            self._kv_cache_config = kv_cache_config
            self._role = role

        @property
        def role(self):
            return self._role

        def bind_connector_metadata(self, connector_metadata):
            self._connector_metadata = connector_metadata

        def clear_connector_metadata(self):
            self._connector_metadata = None

        def _get_connector_metadata(self):
            assert self._connector_metadata is not None
            return self._connector_metadata

        def has_connector_metadata(self):
            return self._connector_metadata is not None



@dataclasses.dataclass
class KvtierConnectorMetadata(KVConnectorMetadata):
    """One step's metadata: kvtier's bytes for each KV cache group, the requests preempted
    in the step (for the workers' handle_preemptions), and the requests finished since the
    last step whose blocks stores still read, each with the number of groups whose stores
    do (a worker lists it in finished_sending once that many groups have ended theirs)."""
    metas: tuple = ()
    preempted_req_ids: frozenset = frozenset()
    sending: dict = dataclasses.field(default_factory=dict)
    loads: bool = False  # loads were planned since the last step (see start_load_kv)


@dataclasses.dataclass
class KvtierWorkerMetadata(KVConnectorWorkerMetadata):
    """The worker's reports since its last step, (KV cache group, bytes) each, for
    update_connector_output."""
    reports: list = dataclasses.field(default_factory=list)

    def aggregate(self, other):
        return KvtierWorkerMetadata(self.reports + other.reports)


_EXTRA_KEYS = frozenset(("g2_blocks", "g3_blocks", "g3_path", "store_tier", "offload",
                         "lazy_offload", "load_async", "salt", "num_gpu_blocks", "manager",
                         "cross_layer_blocks"))
# vLLM's media (vllm/distributed/kv_events.py) of kvtier's tiers.
MEDIUM = {kvtier.G2: "CPU", kvtier.G3: "FS"}


def _count(extra, key):
    v = extra.get(key, 0)
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError("kvtier.vllm: kv_connector_extra_config %s is a number of blocks >= 0 "
                         "(got %r)" % (key, v))
    return v


def _flag(extra, key):
    v = extra.get(key, False)
    if not isinstance(v, bool):
        raise ValueError("kvtier.vllm: kv_connector_extra_config %s is true or false (got %r)"
                         % (key, v))
    return v


def _options(extra):
    """kvtier's manager and connector settings from kv_connector_extra_config; a bad value
    is a ValueError naming its key."""
    unknown = set(extra) - _EXTRA_KEYS
    if unknown:
        raise ValueError("kvtier.vllm: unknown kv_connector_extra_config keys %s (known: %s)"
                         % (sorted(unknown), ", ".join(sorted(_EXTRA_KEYS))))
    tiers = {"G2": kvtier.G2, "G3": kvtier.G3}
    modes = {"eager": kvtier.OFFLOAD_EAGER, "lazy": kvtier.OFFLOAD_LAZY}
    tier, mode = str(extra.get("store_tier", "G2")).upper(), str(extra.get("offload", "eager"))
    if tier not in tiers:
        raise ValueError("kvtier.vllm: store_tier is G2 or G3 (got %r)" % extra["store_tier"])
    if mode.lower() not in modes:
        raise ValueError("kvtier.vllm: offload is eager or lazy (got %r)" % extra["offload"])
    offload = modes[mode.lower()]
    if "lazy_offload" in extra:
        offload = kvtier.OFFLOAD_LAZY if _flag(extra, "lazy_offload") else kvtier.OFFLOAD_EAGER
    manager = extra.get("manager") or {}
    if not isinstance(manager, dict):
        raise ValueError("kvtier.vllm: manager is a dict of kvt_manager_config fields (got %r)"
                         % (manager,))
    bad = sorted(set(manager) - kvtier._CONFIG_FIELDS - {"g3_path"})
    if bad:
        raise ValueError("kvtier.vllm: manager has fields that kvt_manager_config lacks: %s"
                         % ", ".join(map(str, bad)))
    manager = dict(manager, g2_blocks=_count(extra, "g2_blocks"),
                   g3_blocks=_count(extra, "g3_blocks"))
    if manager[("g2_blocks", "g3_blocks")[tiers[tier] == kvtier.G3]] == 0:
        raise ValueError("kvtier.vllm: store_tier %s needs %s_blocks > 0"
                         % (tier, tier.lower()))
    connector = dict(store_tier=tiers[tier], offload=offload,
                     load_async=_flag(extra, "load_async"))
    salt = extra.get("salt")
    return manager, connector, extra.get("g3_path"), None if salt is None else str(salt)


def _parallel(vllm_config, role):
    """(world_size, rank, TP, PP, the data-parallel rank or None) from vLLM's
    parallel_config; a ValueError names what kvtier cannot serve (context parallel, the
    external launcher with world_size > 1) or what does not add up."""
    parallel = getattr(vllm_config, "parallel_config", None)

    def size(field, default=1):
        v = getattr(parallel, field, default)
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError("kvtier.vllm: parallel_config.%s is an int (got %r)" % (field, v))
        return v

    for field in ("decode_context_parallel_size", "prefill_context_parallel_size"):
        if size(field) > 1:
            raise ValueError("kvtier.vllm: %s %d: context parallel is not supported yet "
                             "(a block's tokens would be split across ranks)"
                             % (field, size(field)))
    world, tp, pp = size("world_size"), size("tensor_parallel_size"), \
        size("pipeline_parallel_size")
    if world < 1 or tp < 1 or pp < 1:
        raise ValueError("kvtier.vllm: parallel_config world_size %d, tensor_parallel_size "
                         "%d, pipeline_parallel_size %d: each is >= 1" % (world, tp, pp))
    if getattr(parallel, "rank", None) is not None:
        rank = size("rank")
    elif world > 1 and getattr(role, "name", None) == "WORKER":
        # (vLLM's ParallelConfig always has it.) Two workers both taken as rank 0 would
        # report as one rank twice: the scheduler half refuses that, and no batch ends.
        raise ValueError("kvtier.vllm: a worker of world_size %d needs parallel_config.rank"
                         % world)
    else:
        rank = 0
    if not 0 <= rank < world:
        raise ValueError("kvtier.vllm: parallel_config.rank %d is not in [0, world_size %d)"
                         % (rank, world))
    if world > 1 and str(getattr(parallel, "distributed_executor_backend", None)) \
            == "external_launcher":
        # Each process runs a scheduler of its own over one worker (UniProcExecutor): no
        # aggregator counts the ranks' reports, and every scheduler must decide as the others
        # do, which per-rank tiers that can diverge would not guarantee.
        raise ValueError("kvtier.vllm: distributed_executor_backend 'external_launcher' with "
                         "world_size %d is not supported: use the 'mp' or 'ray' executor, "
                         "whose one scheduler serves every rank" % world)
    # Data-parallel engines on one host each have a G3 of their own (its file is locked).
    dp_rank = size("data_parallel_rank", 0) if size("data_parallel_size") > 1 else None
    return world, rank, tp, pp, dp_rank


def _identity(vllm_config, salt):
    """What, besides a request's tokens, decides every block's bytes in this deployment:
    the model and its weights' revision, the dtypes, the page size, and the user's salt.
    Its hash names every block, so that a G3 file or a G4 key of another model or dtype is a
    miss, never a wrong block."""
    model = getattr(vllm_config, "model_config", None)
    cache = getattr(vllm_config, "cache_config", None)
    parts = ["kvtier.vllm/1", salt,
             getattr(model, "model", None), getattr(model, "revision", None),
             getattr(model, "tokenizer_revision", None),
             str(getattr(model, "dtype", None)), getattr(cache, "cache_dtype", None),
             getattr(cache, "block_size", None)]
    return json.dumps([None if p is None else str(p) for p in parts])


class _Name:
    """vLLM's name of a block kvtier stores (its hash, its parent's, its tokens), for the KV
    events, and who needs it: the tiers that hold the block and the live requests."""
    __slots__ = ("block_hash", "parent", "token_ids", "lora_id", "lora_name", "extra_keys",
                 "tiers", "live")

    def __init__(self, block_hash, parent, token_ids, lora, extra_keys):
        self.block_hash, self.parent, self.token_ids = block_hash, parent, token_ids
        self.lora_id = getattr(lora, "lora_int_id", None) if lora else None
        self.lora_name = getattr(lora, "lora_name", None) if lora else None
        self.extra_keys, self.tiers, self.live = extra_keys, 0, 0


def _vllm_hash_helpers():
    """vLLM's conversion of a block hash for its KV events, and its per-block extra keys,
    where vLLM is installed."""
    try:
        from vllm.v1.core import kv_cache_utils as u
        return u.maybe_convert_block_hash, getattr(u, "generate_block_hash_extra_keys", None)
    except Exception:  # noqa: BLE001 - any failure to import vLLM's module: raw hashes
        return (lambda h: h), None


# vLLM's KVCacheSpec classes (by name: vLLM need not be importable here) and what kvtier
# makes of each: the spec kind vLLM's KV events carry, and whether it has a sliding window.
_SPEC_KINDS = (("SlidingWindowMLASpec", "sliding_window_mla"),
               ("SlidingWindowSpec", "sliding_window"),
               ("MLAAttentionSpec", "mla_attention"),
               ("FullAttentionSpec", "full_attention"))
# Full-attention subclasses whose managers free or skip blocks by rules of their own.
_REFUSED_SPECS = ("RSWASpec", "SinkFullAttentionSpec")


def _mamba(spec, where):
    """A Mamba group's ("mamba", 0), once its spec is one kvtier serves. Its block j holds
    the recurrent state after (j + 1) * block_size tokens once the request has passed that
    point, and a hit of n tokens needs that one state block, at n / block_size - 1
    (MambaManager.find_longest_cache_hit): to kvtier, a window of one block (see
    _Group.connector_window)."""
    mode = getattr(spec, "mamba_cache_mode", "none")
    if mode not in ("all", "align"):
        raise ValueError("kvtier.vllm: %s is Mamba with mamba_cache_mode %r: no state is kept "
                         "at block boundaries, so none can be stored or loaded; turn prefix "
                         "caching on (--enable-prefix-caching makes the mode 'all' or "
                         "'align')" % (where, mode))
    if getattr(spec, "num_speculative_blocks", 0):
        raise ValueError("kvtier.vllm: %s is Mamba with %d speculative blocks: speculative "
                         "decoding moves the state blocks within the block table, which "
                         "kvtier does not follow yet" % (where, spec.num_speculative_blocks))
    return "mamba", 0


def _spec_kind(spec, where):
    """(kind, sliding window or 0) of a KV cache group's spec; a ValueError names a spec
    kvtier cannot serve."""
    names = [c.__name__ for c in type(spec).__mro__]
    if names[0] == "UniformTypeKVCacheSpecs":  # layers of one type with other page sizes
        kinds = {_spec_kind(s, where) for s in spec.kv_cache_specs.values()}
        if len(kinds) == 1:
            return kinds.pop()
    elif "MambaSpec" in names:
        return _mamba(spec, where)
    else:
        refused = [n for n in _REFUSED_SPECS if n in names]
        for name, kind in _SPEC_KINDS:
            if name in names and not refused:
                window = int(spec.sliding_window) if kind.startswith("sliding") else 0
                return kind, window
    raise ValueError("kvtier.vllm: %s is %s: kvtier serves full attention (MLA included), "
                     "sliding-window and Mamba groups; not chunked-local, cross or "
                     "encoder-only attention yet" % (where, names[0]))


class _Group:
    """One of vLLM's KV cache groups (a single one for a uniform model): its spec's block
    size, sliding window and kind, its layers, and the kvtier manager and connector that
    serve it. vLLM's block ids are per group, and so are kvtier's names of the blocks (at
    the group's block size) and vLLM's names of them for the KV events."""

    def __init__(self, index, block_size, kind, window, layer_names):
        self.index, self.block_size, self.kind, self.window = index, block_size, kind, window
        self.layer_names = layer_names  # None: every layer (no kv_cache_config)
        # The window kvtier's connector serves. vLLM's MambaManager keeps only the last
        # computed token's state (get_num_skipped_tokens: n - 1), as a window of 2 tokens
        # would: a hit needs one block, and a block is freed once the request is a token
        # past it, when its state is stored.
        self.connector_window = 2 if kind == "mamba" else window
        self.manager = self.connector = None
        # scheduler: per request, kvtier's hasher, its block hashes, the block ids seen
        self.seqs, self.hashes, self.blocks_seen = {}, {}, {}
        # kvtier's sequence hash -> _Name: of blocks that a tier or a live request holds,
        # and the most recent others (a finished request's store may still register, a lazy
        # store comes when the engine reuses the block), at most twice the engine's blocks.
        self.names, self.recent = {}, collections.OrderedDict()
        # worker: layer name -> index in this group's manager
        self.layers = {}
        self.state_layout = None  # a Mamba group's state shapes and dtypes (see _groups)


def _groups(vllm_config, kv_cache_config):
    """The KV cache groups, and the block size of vLLM's request block hashes (the GCD of
    the groups' block sizes, or cache_config.prefix_match_unit; vLLM's
    resolve_kv_cache_block_sizes)."""
    cache = vllm_config.cache_config
    groups = list(getattr(kv_cache_config, "kv_cache_groups", None) or ())
    if not groups:
        return [_Group(0, cache.block_size, "full_attention", 0, None)], cache.block_size
    out = []
    for g, group in enumerate(groups):
        spec = group.kv_cache_spec
        kind, window = _spec_kind(spec, "KV cache group %d" % g)
        # (a Mamba group's block size is its mamba_block_size)
        size = cache.block_size if len(groups) == 1 and kind != "mamba" else spec.block_size
        out.append(_Group(g, size, kind, window, list(group.layer_names)))
        if kind == "mamba":
            # What a state page holds besides the tokens: a G3 file of other state shapes
            # or dtypes (mamba_ssm_cache_dtype, say) is another namespace.
            out[-1].state_layout = [str(getattr(spec, f, None)) for f in (
                "shapes", "dtypes", "mamba_type", "page_size_bytes")]
    if len(out) == 1:
        return out, out[0].block_size
    unit = getattr(cache, "prefix_match_unit", None)
    unit = unit if unit is not None else math.gcd(*(g.block_size for g in out))
    return out, unit


class KvtierConnector(KVConnectorBase_V1, SupportsHMA):
    """vLLM's KV connector over kvtier: prefix hits from G2/G3, eager or lazy offload of the
    engine's blocks.

    Hybrid models (SupportsHMA): one kvtier manager and connector per KV cache group, each
    with its group's block size and, for a sliding-window group, its window: a hit there
    needs only the blocks inside the window before the hit's end, and only those are
    loaded (vLLM's SlidingWindowManager's rule). The groups agree on one hit: the longest
    that every group serves. Full-attention (MLA included), sliding-window and Mamba groups
    are served; chunked-local, cross and encoder-only attention groups are refused. A Mamba
    group stores each state block a request has passed (block j: the state after
    (j + 1) * block_size tokens) and loads the one a hit needs, asynchronously (Mamba
    layers have no layer hooks).

    Tensor and pipeline parallel: one scheduler connector (world_size = the engine's
    parallel_config.world_size) and one worker connector per rank (world_size and its
    parallel_config.rank), each worker over a manager of its own that holds its shard of
    every block (its KV heads under TP, its layers under PP) at the slot the scheduler
    chose. The scheduler names a block once, for all ranks; it counts a block as stored only
    when every rank stored its shard, and a load that failed on any rank removes the block
    (vLLM's KVOutputAggregator unions the ranks' invalid_block_ids; under its
    kv_load_failure_policy "recompute" every rank recomputes). The 'external_launcher'
    executor with world_size > 1 is refused (a scheduler per process, no aggregator). Each
    worker's G3 file lives in <g3_path>/rank-<r>-of-<N> (under <g3_path>/dp-<d> when
    data_parallel_size > 1, and in group-<g> below it with several KV cache groups), and its
    G3/G4 namespaces are the deployment's folded with (rank, world_size, TP, PP) and the
    group: a persistent G3 file of another rank, layout or group is refused, never read as
    this one's. Decode and prefill context parallel (DCP/PCP > 1) are not supported."""

    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        extra = self._kv_transfer_config.kv_connector_extra_config or {}
        self._manager_config, self._connector_config, self._g3_path, salt = _options(extra)
        self._world, self._rank, self._tp, self._pp, self._dp_rank = _parallel(vllm_config,
                                                                               role)
        self._groups, self._hash_block = _groups(vllm_config, kv_cache_config)
        self._cross_layer = _flag(extra, "cross_layer_blocks")
        self._cross_layer_registered = False
        # worker: the KV caches are CUDA memory (see wait_for_save)
        self._cuda_g1 = False
        if any(g.kind == "mamba" for g in self._groups):
            if self._connector_config["offload"] == kvtier.OFFLOAD_LAZY:
                raise ValueError("kvtier.vllm: offload 'lazy' with Mamba layers: vLLM frees "
                                 "and rewrites a request's state blocks as it runs, so they "
                                 "cannot be stored lazily; use 'eager'")
            # Mamba layers have no layer hooks (wait_for_layer_load) to wait for a load, and
            # in mamba_cache_mode 'align' the model runner copies the loaded state forward
            # before start_load_kv: a hit loads while vLLM waits (WAITING_FOR_REMOTE_KVS),
            # as vLLM's OffloadingConnector loads it.
            self._connector_config["load_async"] = True
        if len(self._groups) > 1 and self._connector_config["offload"] == kvtier.OFFLOAD_LAZY:
            raise ValueError("kvtier.vllm: offload 'lazy' with %d KV cache groups: a block "
                             "one group frees (a sliding window's) is reused by another group "
                             "unseen, so it cannot be stored lazily; use 'eager'"
                             % len(self._groups))
        if kv_cache_config is not None:
            self._num_gpu_blocks = kv_cache_config.num_blocks
        elif "num_gpu_blocks" in extra:
            self._num_gpu_blocks = _count(extra, "num_gpu_blocks")
        else:
            raise ValueError("kvtier.vllm: no kv_cache_config, and no num_gpu_blocks in "
                             "kv_connector_extra_config")
        self._identity = _identity(vllm_config, salt)
        base = kvtier.hash_salt(self._identity)
        self._base_salt = base
        self._connector_config["salt_hash"] = base
        for field in ("g3_namespace", "g4_namespace"):
            self._manager_config.setdefault(field, base)
        # vLLM publishes what take_events returns only with KV events on; a config without
        # the attribute at all (not vLLM's) gets them.
        events = getattr(vllm_config, "kv_events_config", self)
        self._publish = events is self or bool(getattr(events, "enable_kv_cache_events", False))
        self._convert_hash, self._extra_keys = _vllm_hash_helpers()
        # scheduler: per request, its Request, salt, and how many of its tokens the
        # connector has seen (blocks are per group)
        self._requests, self._salts, self._tokens_seen, self._admitted = {}, {}, {}, set()
        self._bypass = set()     # requests kvtier cannot name (prompt embeddings)
        self._loads_planned = False  # since the last build_connector_meta
        self._resetting = False  # a reset_cache some group refused (see there)
        # finished, blocks kept until the worker's finished_sending: request -> the groups
        # whose stores still read them (the next metadata tells the workers)
        self._delayed, self._sending = set(), {}
        # worker: layer name -> its group; reports since the last step; per request, the
        # groups still to list it in finished_sending, and how many listed its async load
        self._layer_group, self._reports, self._load_errors = {}, [], set()
        self._sending_need, self._recving_seen = {}, collections.Counter()
        if getattr(role, "name", None) == "SCHEDULER":
            for g in self._groups:
                self._open(g, kvtier.ROLE_SCHEDULER, num_layers=1, num_outer=1, chunk_bytes=0)

    @property
    def manager(self):
        """The first KV cache group's kvtier.Manager (None until opened)."""
        return self._groups[0].manager

    @property
    def connector(self):
        """The first KV cache group's kvtier.Connector (None until opened)."""
        return self._groups[0].connector

    @property
    def prefer_cross_layer_blocks(self):
        """kv_connector_extra_config cross_layer_blocks (vLLM honours it only for one KV
        cache group whose backend keeps blocks outermost)."""
        return self._cross_layer and len(self._groups) == 1

    @property
    def requires_kv_delivery(self):
        """A best-effort cache: a store dropped by a preemption is a later miss, no more."""
        return False

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config):
        """wait_for_layer_load waits for the loads inside the model's forward: a full CUDA
        graph would skip it and read blocks still being loaded."""
        return True

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config):
        """None: kvtier reads the physical layout from the tensors' strides and copies
        whatever a block occupies, so every backend's layout serves."""
        return None

    def _open(self, group, role, **shape):
        config = dict(self._manager_config)
        # g3_path may come in manager={...} too (it was passed twice then); the key wins
        g3_path = config.pop("g3_path", None)
        if self._g3_path is not None:
            g3_path = self._g3_path
        connector = dict(self._connector_config, world_size=self._world,
                         sliding_window=group.connector_window)
        if role == kvtier.ROLE_SCHEDULER and config.get("g3_persist"):
            # The worker's manager owns the persistent file (and its lock); the scheduler's,
            # which holds no bytes, keeps its G3 registry in a file of its own.
            config["g3_persist"], g3_path = 0, None
        subdirs = []
        if self._dp_rank is not None:
            subdirs.append("dp-%d" % self._dp_rank)
        if role == kvtier.ROLE_WORKER:
            connector["rank"] = self._rank
            if self._world > 1:
                # This rank's shard: a directory of its own (the persistent file is always
                # kvtier-g3.bin, under an exclusive lock), and namespaces of its own, so that
                # another rank's G3 file is a mismatch, never read as this shard. Block names
                # (the salt) stay the scheduler's: every rank holds block h at the same slot.
                subdirs.append("rank-%d-of-%d" % (self._rank, self._world))
                for field in ("g3_namespace", "g4_namespace"):
                    config[field] = kvtier.hash_salt(json.dumps(
                        [str(config[field]), "shard", self._rank, self._world, self._tp,
                         self._pp]))
        if len(self._groups) > 1:
            # Each group's blocks are other layers' bytes under the same token hashes.
            subdirs.append("group-%d" % group.index)
            for field in ("g3_namespace", "g4_namespace"):
                config[field] = kvtier.hash_salt(json.dumps(
                    [str(config[field]), "group", group.index, group.block_size,
                     group.kind, group.window]))
        if group.state_layout is not None:
            for field in ("g3_namespace", "g4_namespace"):
                config[field] = kvtier.hash_salt(json.dumps(
                    [str(config[field]), "mamba state", group.state_layout]))
        if g3_path is not None and subdirs:
            g3_path = os.path.join(str(g3_path), *subdirs)
            os.makedirs(g3_path, exist_ok=True)
        try:
            group.manager = kvtier.Manager(g3_path=g3_path, page_size=group.block_size,
                                           g1_blocks=1, **shape, **config)
        except kvtier.InvalidArgumentError as e:  # a manager field's value
            raise ValueError("kvtier.vllm: %s" % e) from None
        try:
            group.connector = kvtier.Connector(group.manager, role=role,
                                               num_gpu_blocks=self._num_gpu_blocks,
                                               **connector)
        except BaseException:
            group.manager.close()
            group.manager = None
            raise

    def _live(self):
        """The groups, once their connectors are open."""
        if self._groups[-1].connector is None:
            raise kvtier.StateError("kvtier.vllm: register_kv_caches comes first on a worker",
                                    kvtier.CONST["KVT_ERR_STATE"])
        return self._groups

    def shutdown(self):
        for g in self._groups:
            for seq in g.seqs.values():
                seq.close()
            g.seqs.clear()
            if g.manager is not None:
                g.manager.close()  # closes the connector first
            g.manager = g.connector = None

    # ---- scheduler side: identity ----

    def _salt_of(self, request):
        """The salt that names the request's blocks: the deployment's, with everything of
        the request that vLLM's block hashes include besides tokens (cache_salt, the LoRA
        adapter, multimodal inputs with their positions). Two requests share a kvtier block
        only when vLLM would let them share it. None: kvtier cannot name its blocks
        (prompt embeddings, which vLLM hashes per block from the tensors)."""
        if getattr(request, "prompt_embeds", None) is not None:
            return None
        parts = []
        if getattr(request, "cache_salt", None) is not None:
            parts.append(["cache_salt", request.cache_salt])
        lora = getattr(request, "lora_request", None)
        if lora is not None:
            parts.append(["lora", lora.lora_name])
        for f in getattr(request, "mm_features", None) or ():
            pos = f.mm_position
            parts.append(["mm", str(f.identifier), pos.offset, pos.length])
        if not parts:
            return self._base_salt
        return kvtier.hash_salt(json.dumps([self._identity] + parts))

    def _name_blocks(self, g, request):
        """Learns vLLM's names of the request's full blocks of group g that kvtier has not
        named yet: a block's vLLM hash is the request's block hash at the last hash
        boundary inside it (vLLM's BlockHashListWithBlockSize)."""
        rid, size = request.request_id, g.block_size
        scale = size // self._hash_block
        seq, hashes = g.seqs.get(rid), g.hashes.setdefault(rid, [])
        if seq is None:
            seq = g.seqs[rid] = kvtier.Seq(size, self._salts[rid])
        tokens, theirs = request.all_token_ids, getattr(request, "block_hashes", ())
        done = len(hashes) * size
        full = min(len(tokens) // size, len(theirs) // scale)
        if full <= len(hashes):
            return
        seq.append(list(tokens[done:full * size]))
        first = len(hashes)  # the loop appends to hashes
        mine = seq.hashes(first)  # only the new blocks': decode adds one at a time
        lora = getattr(request, "lora_request", None)
        for i in range(first, full):
            h = mine[i - first]
            name = self._name(g, h)
            if name is None:
                start = i * size
                extra = None
                if self._extra_keys is not None:
                    try:
                        extra = self._extra_keys(request, start, start + size, 0)[0]
                    except Exception:  # noqa: BLE001 - only the events' extra_keys go
                        extra = None
                name = g.names[h] = _Name(
                    self._convert_hash(theirs[(i + 1) * scale - 1]),
                    self._convert_hash(theirs[i * scale - 1]) if i else None,
                    list(tokens[start:start + size]), lora, extra)
            name.live += 1
            hashes.append(h)

    @staticmethod
    def _name(g, h):
        """The name of kvtier's block h in group g, taken back from the recent ones if it
        is there."""
        name = g.names.get(h)
        if name is None:
            name = g.recent.pop(h, None)
            if name is not None:
                g.names[h] = name
        return name

    def _unneeded(self, g, h, name):
        if name.live <= 0 and not name.tiers:
            del g.names[h]
            g.recent[h] = name
            while len(g.recent) > 2 * self._num_gpu_blocks:
                g.recent.popitem(last=False)

    def _forget(self, rid):
        """The scheduler side's per-request state, once vLLM is done with the request; the
        names its blocks held go back to the recent ones."""
        for d in (self._requests, self._tokens_seen, self._salts):
            d.pop(rid, None)
        self._admitted.discard(rid)
        for g in self._groups:
            g.blocks_seen.pop(rid, None)
            seq = g.seqs.pop(rid, None)
            if seq is not None:
                seq.close()
            for h in g.hashes.pop(rid, ()):
                name = g.names.get(h)
                if name is not None:
                    name.live -= 1
                    self._unneeded(g, h, name)

    # ---- scheduler side ----

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        rid = request.request_id
        salt = self._salt_of(request)
        if salt is None:
            self._bypass.add(rid)
            return 0, False
        if self._resetting:  # see reset_cache
            self._bypass.add(rid)
            return 0, False
        if self._salts.get(rid, salt) != salt:  # its identity changed: name it anew
            self._forget(rid)
        groups, tokens = self._live(), list(request.all_token_ids)
        hits = [g.connector.get_num_new_matched_tokens(rid, tokens, num_computed_tokens,
                                                       salt=salt) for g in groups]
        # One hit for all groups (vLLM's hybrid coordinator's fixed point): each group that
        # found more is asked again with the smallest as its cap, which a sliding window
        # may lower further, until every group serves the same.
        cap = min(n for n, _ in hits)
        while any(n != cap for n, _ in hits):
            hits = [(n, a) if n == cap else g.connector.get_num_new_matched_tokens(
                rid, tokens, num_computed_tokens, salt=salt, max_tokens=cap)
                for g, (n, a) in zip(groups, hits)]
            cap = min(n for n, _ in hits)
        self._requests[rid], self._salts[rid] = request, salt
        self._tokens_seen[rid] = len(tokens)
        self._admitted.discard(rid)  # a new admission: update_state_after_alloc follows
        return cap, bool(hits[0][1] and cap)

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        rid = request.request_id
        if rid in self._bypass or rid in self._admitted:
            # vLLM's second call, after an async load: the blocks added since reach kvtier
            # through build_connector_meta (new_block_ids).
            return
        per_group = blocks.get_block_ids()
        for g in self._live():
            ids = _ids(per_group[g.index])
            g.connector.update_state_after_alloc(rid, ids, num_external_tokens)
            g.blocks_seen[rid] = len(ids)
        self._admitted.add(rid)
        self._loads_planned |= num_external_tokens > 0

    def _new_tokens(self, rid):
        request = self._requests.get(rid)
        if request is None:
            return []
        tokens = request.all_token_ids
        seen, self._tokens_seen[rid] = self._tokens_seen.get(rid, 0), len(tokens)
        return list(tokens[seen:])

    def build_connector_meta(self, scheduler_output):
        groups = self._live()
        preempted = frozenset(scheduler_output.preempted_req_ids or ())
        for rid in preempted:
            if rid in self._requests:  # kvtier knows it (not bypassed, not aborted unseen)
                for g in groups:
                    g.connector.request_preempted(rid)
        # per scheduled request: (id, computed, scheduled, new tokens, block ids per group,
        # whether they replace the list)
        steps, num_tokens = [], scheduler_output.num_scheduled_tokens
        for new in scheduler_output.scheduled_new_reqs:
            if new.req_id in self._requests:
                self._admitted.add(new.req_id)
                steps.append((new.req_id, new.num_computed_tokens, new.block_ids, True))
        cached = scheduler_output.scheduled_cached_reqs
        for i, rid in enumerate(cached.req_ids):
            if rid in self._requests:
                steps.append((rid, cached.num_computed_tokens[i], cached.new_block_ids[i],
                              rid in cached.resumed_req_ids))
        reqs = [[] for _ in groups]
        for rid, computed, block_ids, replace in steps:
            new_tokens = self._new_tokens(rid)
            for g in groups:
                ids = _ids(block_ids[g.index]) if block_ids else []
                seen = g.blocks_seen.get(rid, 0)
                if replace:  # ids are the request's whole list: kvtier has the first `seen`
                    ids, g.blocks_seen[rid] = ids[seen:], len(ids)
                else:
                    g.blocks_seen[rid] = seen + len(ids)
                reqs[g.index].append(kvtier.ScheduledRequest(
                    rid, computed, num_tokens.get(rid, 0), ids, new_tokens))
        metas = tuple(g.connector.build_connector_meta(r) for g, r in zip(groups, reqs))
        sending, self._sending = self._sending, {}
        meta = KvtierConnectorMetadata(metas, preempted, sending, self._loads_planned)
        self._loads_planned = False
        if self._publish:
            for rid, *_ in steps:
                for g in groups:
                    self._name_blocks(g, self._requests[rid])
        return meta

    def update_connector_output(self, connector_output):
        meta = getattr(connector_output, "kv_connector_worker_meta", None)
        if isinstance(meta, KvtierWorkerMetadata):
            groups = self._live()
            for g, report in meta.reports:
                groups[g].connector.update_connector_output(report)
        self._delayed -= set(connector_output.finished_sending or ())

    def has_pending_push_work(self):
        """True while a finished request's blocks wait for finished_sending: the engine must
        keep stepping for the worker to report it."""
        return bool(self._delayed)

    def request_finished(self, request, block_ids):
        """vLLM's call for a connector of one KV cache group (HMA off)."""
        return self.request_finished_all_groups(request, (block_ids,))

    def request_finished_all_groups(self, request, block_ids):
        """Every group's connector is told; vLLM keeps the blocks (of all groups) while any
        group's stores read them, until the workers list the request in finished_sending."""
        rid = request.request_id
        self._bypass.discard(rid)
        self._forget(rid)
        delaying = 0
        for g in self._live():
            try:
                delaying += bool(g.connector.request_finished(rid))
            except kvtier.NotFoundError:  # aborted before the connector saw it
                pass
        if delaying:
            self._delayed.add(rid)
            self._sending[rid] = delaying
        return bool(delaying), None

    def reset_cache(self):
        """vLLM's reset_connector_cache (after a weight reload, say): nothing kvtier stored
        before is served again. False (vLLM's reset_prefix_cache then fails, to be retried)
        while loads are in flight, which would bring the old KV back."""
        # A group refuses while its loads are in flight, and a group's loads can end before
        # another's: until every group has reset, no hit is served (it could pair one
        # group's new KV with another's old).
        self._resetting = True
        for g in self._live():
            try:
                g.connector.reset_cache()
            except kvtier.StateError:
                return False
        self._resetting = False
        return True

    def take_events(self):
        """G2/G3's BLOCK_STORED/REMOVED as vLLM's BlockStored/BlockRemoved, named as vLLM's
        own GPU events name the same blocks (vLLM's block hashes, parent, token ids, LoRA,
        the group's index, spec kind and sliding window), medium "CPU" for G2 and "FS" for
        G3. Without vLLM installed, kvtier.Event."""
        try:
            from vllm.distributed import kv_events
        except ImportError:
            kv_events = None
        out = []
        for g in self._live():
            out += self._group_events(g, kv_events)
        return out

    def _group_events(self, g, kv_events):
        raw, c = [], g.connector
        while True:  # all of them: the queue is bounded, and what overflows it is dropped
            got = c.take_events(1024)
            raw += got
            if len(got) < 1024:
                break
        out = []
        for e in raw:
            if e.type == kvtier.EVENTS_DROPPED:
                # What the tiers hold is unknown from here on: say so, and learn anew.
                g.names = {h: n for h, n in g.names.items() if n.live > 0}
                for name in g.names.values():
                    name.tiers = 0
                g.recent.clear()
                if kv_events is not None:
                    out.append(kv_events.AllBlocksCleared())
                continue
            if e.type not in (kvtier.BLOCK_STORED, kvtier.BLOCK_REMOVED):
                continue
            name, bit = self._name(g, e.hash), 1 << e.tier
            if name is None:  # not named in this process (a recovered G3), or long forgotten
                continue
            if e.type == kvtier.BLOCK_STORED:
                name.tiers |= bit
                if kv_events is not None:
                    out.append(kv_events.BlockStored(
                        block_hashes=[name.block_hash], parent_block_hash=name.parent,
                        token_ids=list(name.token_ids), block_size=g.block_size,
                        lora_id=name.lora_id, medium=MEDIUM.get(e.tier),
                        lora_name=name.lora_name,
                        extra_keys=None if name.extra_keys is None else [name.extra_keys],
                        group_idx=g.index, kv_cache_spec_kind=g.kind,
                        kv_cache_spec_sliding_window=g.window or None))
            else:
                name.tiers &= ~bit
                if kv_events is not None:
                    out.append(kv_events.BlockRemoved(block_hashes=[name.block_hash],
                                                      medium=MEDIUM.get(e.tier),
                                                      group_idx=g.index))
                self._unneeded(g, e.hash, name)
        return out if kv_events is not None else [
            e for e in raw if e.type in (kvtier.BLOCK_STORED, kvtier.BLOCK_REMOVED)]

    # ---- worker side ----

    def register_kv_caches(self, kv_caches):
        def key(t):
            return (t.data_ptr(), tuple(t.shape), tuple(t.stride(d) for d in range(len(t.shape))))

        # vLLM's groups share tensors (tensor i is layer i of every group): a group's layers
        # are its own names. A layer in no group shares another layer's cache (vLLM's KV
        # sharing), and is that layer.
        grouped = {}
        for g in self._groups:
            names = list(kv_caches) if g.layer_names is None else \
                [n for n in g.layer_names if n in kv_caches]
            first, alias = {}, {}
            for name in names:
                alias[name] = first.setdefault(key(kv_caches[name]), name)
            unique = {name: kv_caches[name] for name in names if alias[name] == name}
            order, num_outer, chunk_bytes, layout = _vllm_layout.g1_layout(
                unique, self._num_gpu_blocks)
            self._open(g, kvtier.ROLE_WORKER, num_layers=len(order), num_outer=num_outer,
                       chunk_bytes=chunk_bytes)
            g.connector.register_kv_caches(layout, self._num_gpu_blocks)
            self._cuda_g1 = layout.memory == kvtier.MEMORY_CUDA
            index = {name: i for i, name in enumerate(order)}
            for name in names:
                g.layers[name] = index[alias[name]]
                grouped.setdefault(key(kv_caches[name]), (g, g.layers[name]))
                self._layer_group[name] = g
        for name, t in kv_caches.items():
            if name not in self._layer_group and key(t) in grouped:
                g, i = grouped[key(t)]
                g.layers[name], self._layer_group[name] = i, g

    def register_cross_layers_kv_cache(self, kv_cache, attn_backend):
        """vLLM's cross-layer KV cache (instead of register_kv_caches): one tensor whose
        block b holds every layer's KV of block b in one run of bytes, so that one copy per
        block moves all layers. The manager has one layer; every layer's hooks map to it,
        so the first wait_for_layer_load waits for the whole step's loads and stores start
        in wait_for_save, once every layer has written its KV."""
        if len(self._groups) != 1:
            raise ValueError("kvtier.vllm: a cross-layer KV cache with %d KV cache groups "
                             "(vLLM gives one only to a single group)" % len(self._groups))
        g = self._groups[0]
        _, num_outer, chunk_bytes, layout = _vllm_layout.cross_layer_layout(
            kv_cache, self._num_gpu_blocks)
        self._open(g, kvtier.ROLE_WORKER, num_layers=1, num_outer=num_outer,
                   chunk_bytes=chunk_bytes)
        g.connector.register_kv_caches(layout, self._num_gpu_blocks)
        self._cross_layer_registered = True
        self._cuda_g1 = layout.memory == kvtier.MEMORY_CUDA

    def bind_connector_metadata(self, connector_metadata):
        groups = self._live()
        for g, meta in zip(groups, connector_metadata.metas):
            g.connector.bind_connector_metadata(meta)
        for rid, n in connector_metadata.sending.items():
            self._sending_need[rid] = n
        super().bind_connector_metadata(connector_metadata)

    def clear_connector_metadata(self):
        if self.has_connector_metadata():
            for g in self._live():
                g.connector.clear_connector_metadata()
        super().clear_connector_metadata()

    def handle_preemptions(self, kv_connector_metadata):
        ids = (kv_connector_metadata.preempted_req_ids
               if isinstance(kv_connector_metadata, KvtierConnectorMetadata)
               else kv_connector_metadata)  # older vLLM: the set of preempted ids
        # Every step, none preempted too: a windowed (sliding-window or Mamba) group's worker
        # waits here for earlier steps' stores, before vLLM zeroes or copies into the
        # step's new blocks (which may be blocks those stores read).
        for g in self._live():
            if ids or g.connector_window:
                g.connector.handle_preemptions(sorted(ids or ()))

    def start_load_kv(self, forward_context=None, **kwargs):
        if self.has_connector_metadata():
            meta = self._get_connector_metadata()
            if self._cuda_g1 and (getattr(meta, "loads", True) or self._connector_config[
                    "offload"] == kvtier.OFFLOAD_LAZY):
                # Under async scheduling the previous step's kernels may still run on vLLM's
                # stream, which kvtier's copy streams do not follow: a block they still
                # write (a finished request's last token) may be one this step loads into,
                # and a lazy store reads what they wrote.
                import torch
                torch.cuda.current_stream().synchronize()
            for g in self._live():
                g.connector.start_load_kv()

    def _layer(self, layer_name):
        """(the layer's group, its index in the group's manager)"""
        if self._cross_layer_registered:
            return self._groups[0], 0
        g = self._layer_group.get(layer_name)
        if g is None:
            raise kvtier.InvalidArgumentError(
                "kvtier.vllm: layer %r was not in register_kv_caches" % layer_name,
                kvtier.CONST["KVT_ERR_INVALID_ARGUMENT"]) from None
        return g, g.layers[layer_name]

    def wait_for_layer_load(self, layer_name):
        if self.has_connector_metadata():
            g, i = self._layer(layer_name)
            g.connector.wait_for_layer_load(i)

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        # A cross-layer block holds later layers too, and a CUDA layer's kernels may still be
        # queued: their stores wait for wait_for_save.
        if self.has_connector_metadata() and not (self._cross_layer_registered
                                                  or self._cuda_g1):
            g, i = self._layer(layer_name)
            g.connector.save_kv_layer(i)

    def wait_for_save(self):
        if self.has_connector_metadata():
            if self._cuda_g1:
                # vLLM calls the layer hooks after launching a layer's kernels, not after
                # they ran, and kvtier's copy streams do not follow vLLM's: the stores read
                # the step's KV once the engine's stream has written it.
                import torch
                torch.cuda.current_stream().synchronize()
            for g in self._live():
                g.connector.wait_for_save()

    def get_finished(self, finished_req_ids):
        """A request is finished sending once every group whose stores read its blocks has
        listed it, and finished receiving once every group's load of it has ended (an
        asynchronous hit loads in every group)."""
        groups = self._live()
        sending, recving = set(), set()
        for g in groups:
            f = g.connector.get_finished()
            if f.report:
                self._reports.append((g.index, f.report))
            self._load_errors.update(f.load_error_block_ids)
            for rid in f.finished_sending:
                need = self._sending_need.get(rid, 1) - 1
                if need > 0:
                    self._sending_need[rid] = need
                else:
                    self._sending_need.pop(rid, None)
                    sending.add(rid)
            for rid in f.finished_recving:
                self._recving_seen[rid] += 1
                if self._recving_seen[rid] == len(groups):
                    del self._recving_seen[rid]
                    recving.add(rid)
        return sending or None, recving or None

    def get_block_ids_with_load_errors(self):
        errors, self._load_errors = self._load_errors, set()
        return errors

    def build_connector_worker_meta(self):
        if not self._reports:
            return None
        meta, self._reports = KvtierWorkerMetadata(self._reports), []
        return meta


def _ids(block_ids):
    """vLLM's block ids of one group as kvtier takes them: its null block (id 0, in a
    sliding window's tokens that left the window) is KVT_BLOCK_ID_NONE."""
    return [kvtier.BLOCK_ID_NONE if b == 0 else b for b in block_ids]
