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

vLLM's base classes are imported when vLLM is installed; otherwise minimal stand-ins let this
module import (and its non-vLLM parts be used) without it.
"""
import collections
import dataclasses
import enum
import json
import os

import kvtier
from kvtier import _vllm_layout

try:
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (
        KVConnectorBase_V1, KVConnectorMetadata, KVConnectorRole, KVConnectorWorkerMetadata)
except ImportError:
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
    """One step's metadata: kvtier's bytes, and the requests preempted in the step (for the
    workers' handle_preemptions)."""
    meta: bytes = b""
    preempted_req_ids: frozenset = frozenset()


@dataclasses.dataclass
class KvtierWorkerMetadata(KVConnectorWorkerMetadata):
    """The worker's reports (bytes) since its last step, for update_connector_output."""
    reports: list = dataclasses.field(default_factory=list)

    def aggregate(self, other):
        return KvtierWorkerMetadata(self.reports + other.reports)


_EXTRA_KEYS = frozenset(("g2_blocks", "g3_blocks", "g3_path", "store_tier", "offload",
                         "lazy_offload", "load_async", "salt", "num_gpu_blocks", "manager"))
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


class KvtierConnector(KVConnectorBase_V1):
    """vLLM's KV connector over kvtier: prefix hits from G2/G3, eager or lazy offload of the
    engine's blocks; one KV cache group (full attention).

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
    data_parallel_size > 1), and its G3/G4
    namespaces are the deployment's folded with (rank, world_size, TP, PP): a persistent G3
    file of another rank or another parallel layout is refused, never read as this rank's
    shard. Decode and prefill context parallel (DCP/PCP > 1) are not supported."""

    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        extra = self._kv_transfer_config.kv_connector_extra_config or {}
        self._manager_config, self._connector_config, self._g3_path, salt = _options(extra)
        self._world, self._rank, self._tp, self._pp, self._dp_rank = _parallel(vllm_config,
                                                                               role)
        self._page_size = vllm_config.cache_config.block_size
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
        self.manager = self.connector = None  # kvtier.Manager and kvtier.Connector
        # scheduler: per request, its Request, salt, kvtier's hasher and block hashes, and
        # how many of its blocks and tokens the connector has seen
        self._requests, self._salts, self._blocks_seen, self._tokens_seen = {}, {}, {}, {}
        self._seqs, self._hashes = {}, {}
        self._bypass = set()     # requests kvtier cannot name (prompt embeddings)
        self._delayed = set()    # finished, blocks kept until the worker's finished_sending
        # kvtier's sequence hash -> _Name: of blocks that a tier or a live request holds, and
        # the most recent others (a finished request's store may still register, a lazy
        # store comes when the engine reuses the block), at most twice the engine's blocks.
        self._names, self._recent = {}, collections.OrderedDict()
        # worker: layer name -> index, reports and load errors since the last step
        self._layers, self._reports, self._load_errors = {}, [], set()
        if getattr(role, "name", None) == "SCHEDULER":
            self._open(kvtier.ROLE_SCHEDULER, num_layers=1, num_outer=1, chunk_bytes=0)

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

    def _open(self, role, **shape):
        config = dict(self._manager_config)
        # g3_path may come in manager={...} too (it was passed twice then); the key wins
        g3_path = config.pop("g3_path", None)
        if self._g3_path is not None:
            g3_path = self._g3_path
        connector = dict(self._connector_config, world_size=self._world)
        if role == kvtier.ROLE_SCHEDULER and config.get("g3_persist"):
            # The worker's manager owns the persistent file (and its lock); the scheduler's,
            # which holds no bytes, keeps its G3 registry in a file of its own.
            config["g3_persist"], g3_path = 0, None
        if self._dp_rank is not None and g3_path is not None:
            g3_path = os.path.join(str(g3_path), "dp-%d" % self._dp_rank)
            os.makedirs(g3_path, exist_ok=True)
        if role == kvtier.ROLE_WORKER:
            connector["rank"] = self._rank
            if self._world > 1:
                # This rank's shard: a directory of its own (the persistent file is always
                # kvtier-g3.bin, under an exclusive lock), and namespaces of its own, so that
                # another rank's G3 file is a mismatch, never read as this shard. Block names
                # (the salt) stay the scheduler's: every rank holds block h at the same slot.
                if g3_path is not None:
                    g3_path = os.path.join(str(g3_path), "rank-%d-of-%d"
                                           % (self._rank, self._world))
                    os.makedirs(g3_path, exist_ok=True)
                for field in ("g3_namespace", "g4_namespace"):
                    config[field] = kvtier.hash_salt(json.dumps(
                        [str(config[field]), "shard", self._rank, self._world, self._tp,
                         self._pp]))
        try:
            self.manager = kvtier.Manager(g3_path=g3_path, page_size=self._page_size,
                                          g1_blocks=1, **shape, **config)
        except kvtier.InvalidArgumentError as e:  # a manager field's value
            raise ValueError("kvtier.vllm: %s" % e) from None
        try:
            self.connector = kvtier.Connector(self.manager, role=role,
                                              num_gpu_blocks=self._num_gpu_blocks,
                                              **connector)
        except BaseException:
            self.manager.close()
            raise

    def _live(self):
        if self.connector is None:
            raise kvtier.StateError("kvtier.vllm: register_kv_caches comes first on a worker",
                                    kvtier.CONST["KVT_ERR_STATE"])
        return self.connector

    def shutdown(self):
        for seq in self._seqs.values():
            seq.close()
        self._seqs.clear()
        if self.manager is not None:
            self.manager.close()  # closes the connector first
        self.manager = self.connector = None

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

    def _name_blocks(self, request):
        """Learns vLLM's names of the request's full blocks that kvtier has not named yet."""
        rid = request.request_id
        seq, hashes = self._seqs.get(rid), self._hashes.setdefault(rid, [])
        if seq is None:
            seq = self._seqs[rid] = kvtier.Seq(self._page_size, self._salts[rid])
        tokens, theirs = request.all_token_ids, getattr(request, "block_hashes", ())
        done = len(hashes) * self._page_size
        full = min(len(tokens) // self._page_size, len(theirs))
        if full <= len(hashes):
            return
        seq.append(list(tokens[done:full * self._page_size]))
        first = len(hashes)  # the loop appends to hashes
        mine = seq.hashes(first)  # only the new blocks': decode adds one at a time
        lora = getattr(request, "lora_request", None)
        for i in range(first, full):
            h = mine[i - first]
            name = self._name(h)
            if name is None:
                start = i * self._page_size
                extra = None
                if self._extra_keys is not None:
                    try:
                        extra = self._extra_keys(request, start, start + self._page_size, 0)[0]
                    except Exception:  # noqa: BLE001 - only the events' extra_keys go
                        extra = None
                name = self._names[h] = _Name(
                    self._convert_hash(theirs[i]),
                    self._convert_hash(theirs[i - 1]) if i else None,
                    list(tokens[start:start + self._page_size]), lora, extra)
            name.live += 1
            hashes.append(h)

    def _name(self, h):
        """The name of kvtier's block h, taken back from the recent ones if it is there."""
        name = self._names.get(h)
        if name is None:
            name = self._recent.pop(h, None)
            if name is not None:
                self._names[h] = name
        return name

    def _unneeded(self, h, name):
        if name.live <= 0 and not name.tiers:
            del self._names[h]
            self._recent[h] = name
            while len(self._recent) > 2 * self._num_gpu_blocks:
                self._recent.popitem(last=False)

    def _drop_names(self, hashes):
        for h in hashes:
            name = self._names.get(h)
            if name is not None:
                name.live -= 1
                self._unneeded(h, name)

    def _forget(self, rid):
        """The scheduler side's per-request state, once vLLM is done with the request."""
        for d in (self._requests, self._blocks_seen, self._tokens_seen, self._salts):
            d.pop(rid, None)
        seq = self._seqs.pop(rid, None)
        if seq is not None:
            seq.close()
        return self._hashes.pop(rid, [])

    # ---- scheduler side ----

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        rid = request.request_id
        salt = self._salt_of(request)
        if salt is None:
            self._bypass.add(rid)
            return 0, False
        if self._salts.get(rid, salt) != salt:  # its identity changed: name it anew
            self._drop_names(self._forget(rid))
        tokens = list(request.all_token_ids)
        n, is_async = self._live().get_num_new_matched_tokens(rid, tokens, num_computed_tokens,
                                                              salt=salt)
        self._requests[rid], self._salts[rid] = request, salt
        self._tokens_seen[rid] = len(tokens)
        self._blocks_seen.pop(rid, None)  # a new admission: update_state_after_alloc follows
        return n, bool(is_async and n)

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        rid = request.request_id
        if rid in self._bypass or rid in self._blocks_seen:
            # vLLM's second call, after an async load: the blocks added since reach kvtier
            # through build_connector_meta (new_block_ids).
            return
        ids = list(blocks.get_block_ids()[0])
        self._live().update_state_after_alloc(rid, ids, num_external_tokens)
        self._blocks_seen[rid] = len(ids)

    def _new_tokens(self, rid):
        request = self._requests.get(rid)
        if request is None:
            return []
        tokens = request.all_token_ids
        seen, self._tokens_seen[rid] = self._tokens_seen.get(rid, 0), len(tokens)
        return list(tokens[seen:])

    def build_connector_meta(self, scheduler_output):
        c = self._live()
        preempted = frozenset(scheduler_output.preempted_req_ids or ())
        for rid in preempted:
            if rid in self._requests:  # kvtier knows it (not bypassed, not aborted unseen)
                c.request_preempted(rid)
        reqs, num_tokens = [], scheduler_output.num_scheduled_tokens
        for new in scheduler_output.scheduled_new_reqs:
            if new.req_id not in self._requests:
                continue
            ids = list(new.block_ids[0]) if new.block_ids else []
            seen, self._blocks_seen[new.req_id] = self._blocks_seen.get(new.req_id, 0), len(ids)
            reqs.append(kvtier.ScheduledRequest(
                new.req_id, new.num_computed_tokens, num_tokens.get(new.req_id, 0), ids[seen:],
                self._new_tokens(new.req_id)))
        cached = scheduler_output.scheduled_cached_reqs
        for i, rid in enumerate(cached.req_ids):
            if rid not in self._requests:
                continue
            groups = cached.new_block_ids[i]
            ids = list(groups[0]) if groups else []
            seen = self._blocks_seen.get(rid, 0)
            if rid in cached.resumed_req_ids:  # ids replace the request's list
                ids, self._blocks_seen[rid] = ids[seen:], len(ids)
            else:
                self._blocks_seen[rid] = seen + len(ids)
            reqs.append(kvtier.ScheduledRequest(
                rid, cached.num_computed_tokens[i], num_tokens.get(rid, 0), ids,
                self._new_tokens(rid)))
        meta = KvtierConnectorMetadata(c.build_connector_meta(reqs), preempted)
        if self._publish:
            for r in reqs:
                self._name_blocks(self._requests[r.req_id])
        return meta

    def update_connector_output(self, connector_output):
        meta = getattr(connector_output, "kv_connector_worker_meta", None)
        if isinstance(meta, KvtierWorkerMetadata):
            for report in meta.reports:
                self._live().update_connector_output(report)
        self._delayed -= set(connector_output.finished_sending or ())

    def has_pending_push_work(self):
        """True while a finished request's blocks wait for finished_sending: the engine must
        keep stepping for the worker to report it."""
        return bool(self._delayed)

    def request_finished(self, request, block_ids):
        rid = request.request_id
        self._bypass.discard(rid)
        self._drop_names(self._forget(rid))
        try:
            delay_free = self._live().request_finished(rid)
        except kvtier.NotFoundError:  # aborted before the connector saw it
            return False, None
        if delay_free:
            self._delayed.add(rid)
        return delay_free, None

    def reset_cache(self):
        """vLLM's reset_connector_cache (after a weight reload, say): nothing kvtier stored
        before is served again. False (vLLM's reset_prefix_cache then fails, to be retried)
        while loads are in flight, which would bring the old KV back."""
        try:
            self._live().reset_cache()
        except kvtier.StateError:
            return False
        return True

    def take_events(self):
        """G2/G3's BLOCK_STORED/REMOVED as vLLM's BlockStored/BlockRemoved, named as vLLM's
        own GPU events name the same blocks (vLLM's block hashes, parent, token ids, LoRA),
        medium "CPU" for G2 and "FS" for G3. Without vLLM installed, kvtier.Event."""
        raw, c = [], self._live()
        while True:  # all of them: the queue is bounded, and what overflows it is dropped
            got = c.take_events(1024)
            raw += got
            if len(got) < 1024:
                break
        try:
            from vllm.distributed import kv_events
        except ImportError:
            kv_events = None
        out = []
        for e in raw:
            if e.type == kvtier.EVENTS_DROPPED:
                # What the tiers hold is unknown from here on: say so, and learn anew.
                self._names = {h: n for h, n in self._names.items() if n.live > 0}
                for name in self._names.values():
                    name.tiers = 0
                self._recent.clear()
                if kv_events is not None:
                    out.append(kv_events.AllBlocksCleared())
                continue
            if e.type not in (kvtier.BLOCK_STORED, kvtier.BLOCK_REMOVED):
                continue
            name, bit = self._name(e.hash), 1 << e.tier
            if name is None:  # not named in this process (a recovered G3), or long forgotten
                continue
            if e.type == kvtier.BLOCK_STORED:
                name.tiers |= bit
                if kv_events is not None:
                    out.append(kv_events.BlockStored(
                        block_hashes=[name.block_hash], parent_block_hash=name.parent,
                        token_ids=list(name.token_ids), block_size=self._page_size,
                        lora_id=name.lora_id, medium=MEDIUM.get(e.tier),
                        lora_name=name.lora_name,
                        extra_keys=None if name.extra_keys is None else [name.extra_keys]))
            else:
                name.tiers &= ~bit
                if kv_events is not None:
                    out.append(kv_events.BlockRemoved(block_hashes=[name.block_hash],
                                                      medium=MEDIUM.get(e.tier)))
                self._unneeded(e.hash, name)
        return out if kv_events is not None else [
            e for e in raw if e.type in (kvtier.BLOCK_STORED, kvtier.BLOCK_REMOVED)]

    # ---- worker side ----

    def register_kv_caches(self, kv_caches):
        # Layers that share another layer's cache (vLLM's KV sharing) are that layer.
        first, alias = {}, {}
        for name, t in kv_caches.items():
            key = (t.data_ptr(), tuple(t.shape), tuple(t.stride(d) for d in range(len(t.shape))))
            alias[name] = first.setdefault(key, name)
        unique = {name: kv_caches[name] for name in kv_caches if alias[name] == name}
        names, num_outer, chunk_bytes, layout = _vllm_layout.g1_layout(unique,
                                                                       self._num_gpu_blocks)
        self._open(kvtier.ROLE_WORKER, num_layers=len(names), num_outer=num_outer,
                   chunk_bytes=chunk_bytes)
        self.connector.register_kv_caches(layout, self._num_gpu_blocks)
        index = {name: i for i, name in enumerate(names)}
        self._layers = {name: index[alias[name]] for name in kv_caches}

    def bind_connector_metadata(self, connector_metadata):
        self._live().bind_connector_metadata(connector_metadata.meta)
        super().bind_connector_metadata(connector_metadata)

    def clear_connector_metadata(self):
        if self.has_connector_metadata():
            self._live().clear_connector_metadata()
        super().clear_connector_metadata()

    def handle_preemptions(self, kv_connector_metadata):
        ids = (kv_connector_metadata.preempted_req_ids
               if isinstance(kv_connector_metadata, KvtierConnectorMetadata)
               else kv_connector_metadata)  # older vLLM: the set of preempted ids
        if ids:
            self._live().handle_preemptions(sorted(ids))

    def start_load_kv(self, forward_context=None, **kwargs):
        if self.has_connector_metadata():
            self._live().start_load_kv()

    def _layer(self, layer_name):
        try:
            return self._layers[layer_name]
        except KeyError:
            raise kvtier.InvalidArgumentError(
                "kvtier.vllm: layer %r was not in register_kv_caches" % layer_name,
                kvtier.CONST["KVT_ERR_INVALID_ARGUMENT"]) from None

    def wait_for_layer_load(self, layer_name):
        if self.has_connector_metadata():
            self._live().wait_for_layer_load(self._layer(layer_name))

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        if self.has_connector_metadata():
            self._live().save_kv_layer(self._layer(layer_name))

    def wait_for_save(self):
        if self.has_connector_metadata():
            self._live().wait_for_save()

    def get_finished(self, finished_req_ids):
        f = self._live().get_finished()
        if f.report:
            self._reports.append(f.report)
        self._load_errors.update(f.load_error_block_ids)
        return set(f.finished_sending) or None, set(f.finished_recving) or None

    def get_block_ids_with_load_errors(self):
        errors, self._load_errors = self._load_errors, set()
        return errors

    def build_connector_worker_meta(self):
        if not self._reports:
            return None
        meta, self._reports = KvtierWorkerMetadata(self._reports), []
        return meta
