"""kvtier as a vLLM KV connector (KVConnectorBase_V1), loaded by module path:

    vllm serve MODEL --kv-transfer-config '{
        "kv_connector": "KvtierConnector", "kv_connector_module_path": "kvtier.vllm",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"g2_blocks": 65536, "offload": "eager"}}'

The scheduler process gets a SCHEDULER connector over a manager that holds G2/G3 registries
but no KV (chunk_bytes 0); each worker gets a WORKER connector over a manager whose G2/G3
memory holds the KV, created in register_kv_caches once the KV tensors' shapes are known.
The step's metadata (KvtierConnectorMetadata) and the worker's report
(KvtierWorkerMetadata, in KVConnectorOutput.kv_connector_worker_meta) carry kvtier's bytes.

kv_connector_extra_config keys (docs/VLLM.md):
  g2_blocks, g3_blocks   capacities of G2 (host memory) and G3 (a file), in blocks (default 0)
  g3_path                directory of the G3 file
  store_tier             "G2" (default) or "G3": where stores go
  offload                "eager" (default) or "lazy"; lazy_offload (bool), as in vLLM's
                         SimpleCPUOffloadConnector, is accepted too
  load_async             true: loads end between steps (finished_recving); default false
  salt                   salt of kvtier's block hashes (a str; default none)
  num_gpu_blocks         G1 blocks when no kv_cache_config is given
  manager                a dict of further kvt_manager_config fields (g3_io, policies, ...)

The names of vLLM's classes, methods and attributes used here are those of vLLM's source as
recorded in docs/VLLM.md. vLLM is imported when it is installed; otherwise a minimal
stand-in of its base classes lets this module import (and be tested) without it.
"""
import dataclasses
import enum
import importlib
import math

import kvtier

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


def _options(extra):
    """kvtier's manager and connector settings from kv_connector_extra_config."""
    unknown = set(extra) - _EXTRA_KEYS
    if unknown:
        raise ValueError("kvtier.vllm: unknown kv_connector_extra_config keys %s (known: %s)"
                         % (sorted(unknown), ", ".join(sorted(_EXTRA_KEYS))))
    tiers = {"G2": kvtier.G2, "G3": kvtier.G3}
    modes = {"eager": kvtier.OFFLOAD_EAGER, "lazy": kvtier.OFFLOAD_LAZY}
    tier, mode = str(extra.get("store_tier", "G2")).upper(), str(extra.get("offload", "eager"))
    if tier not in tiers or mode.lower() not in modes:
        raise ValueError("kvtier.vllm: store_tier is G2 or G3 (got %r), offload eager or lazy "
                         "(got %r)" % (extra.get("store_tier"), extra.get("offload")))
    offload = modes[mode.lower()]
    if "lazy_offload" in extra:
        offload = kvtier.OFFLOAD_LAZY if extra["lazy_offload"] else kvtier.OFFLOAD_EAGER
    manager = dict(extra.get("manager") or {})
    manager.update(g2_blocks=int(extra.get("g2_blocks", 0)),
                   g3_blocks=int(extra.get("g3_blocks", 0)))
    connector = dict(store_tier=tiers[tier], offload=offload,
                     load_async=bool(extra.get("load_async", False)))
    if extra.get("salt") is not None:
        connector["salt_hash"] = kvtier.hash_salt(str(extra["salt"]))
    return manager, connector, extra.get("g3_path")


def _g1_layout(kv_caches, num_blocks):
    """(layer names in order, num_outer, chunk_bytes, G1Layout) of vLLM's per-layer KV
    tensors, from data_ptr(), stride(), shape and element_size(): blocks first
    (num_blocks, ...) or (num_blocks, 2, ...), or K/V first (2, num_blocks, ...). A chunk
    (one layer's K or V of one block) must be contiguous."""
    names, bases, strides, shapes = list(kv_caches), [], [], set()
    for name in names:
        t = kv_caches[name]
        if not hasattr(t, "data_ptr"):
            raise ValueError("kvtier.vllm: layer %s: a tensor is needed, not %s"
                             % (name, type(t).__name__))
        shape, el = tuple(t.shape), t.element_size()
        if len(shape) >= 3 and shape[0] == 2 and shape[1] == num_blocks:
            outer_dim, block_dim = 0, 1      # (2, num_blocks, ...): FlashAttention
        elif len(shape) >= 3 and shape[0] == num_blocks and shape[1] == 2:
            outer_dim, block_dim = 1, 0      # (num_blocks, 2, ...): FlashInfer
        elif len(shape) >= 2 and shape[0] == num_blocks:
            outer_dim, block_dim = None, 0   # (num_blocks, ...): MLA, K and V together
        else:
            raise ValueError("kvtier.vllm: layer %s: KV shape %s has no dimension of %d blocks"
                             % (name, shape, num_blocks))
        inner = max(block_dim, outer_dim or 0) + 1
        expect = 1
        for d in reversed(range(inner, len(shape))):
            if shape[d] > 1 and t.stride(d) != expect:
                raise ValueError("kvtier.vllm: layer %s: a block's K or V is not contiguous "
                                 "(shape %s)" % (name, shape))
            expect *= shape[d]
        chunk = math.prod(shape[inner:]) * el
        outers = [0] if outer_dim is None else [o * t.stride(outer_dim) * el for o in range(2)]
        total = t.numel() * el
        bases += [(t.data_ptr() + off, total - off) for off in outers]
        strides += [t.stride(block_dim) * el] * len(outers)
        shapes.add((len(outers), chunk))
    if len(shapes) != 1:
        raise ValueError("kvtier.vllm: the layers' KV differ in shape: %s" % sorted(shapes))
    device = getattr(kv_caches[names[0]], "device", None)
    if getattr(device, "type", "cpu") == "cuda":
        memory, index = kvtier.MEMORY_CUDA, device.index or 0
    else:
        memory, index = kvtier.MEMORY_HOST, 0
    (num_outer, chunk_bytes), = shapes
    return names, num_outer, chunk_bytes, kvtier.G1Layout(bases, strides, memory, index)


class KvtierConnector(KVConnectorBase_V1):
    """vLLM's KV connector over kvtier: prefix hits from G2/G3, eager or lazy offload of the
    engine's blocks. One worker per scheduler (tensor and pipeline parallel size 1); one KV
    cache group (full attention)."""

    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        extra = self._kv_transfer_config.kv_connector_extra_config or {}
        self._manager_config, self._connector_config, self._g3_path = _options(extra)
        world = getattr(getattr(vllm_config, "parallel_config", None), "world_size", 1)
        if world != 1:
            raise ValueError("kvtier.vllm: one worker per scheduler (world_size %d)" % world)
        self._page_size = vllm_config.cache_config.block_size
        if kv_cache_config is not None:
            self._num_gpu_blocks = kv_cache_config.num_blocks
        elif "num_gpu_blocks" in extra:
            self._num_gpu_blocks = int(extra["num_gpu_blocks"])
        else:
            raise ValueError("kvtier.vllm: no kv_cache_config, and no num_gpu_blocks in "
                             "kv_connector_extra_config")
        self.manager = self.connector = None  # kvtier.Manager and kvtier.Connector
        # scheduler: per request, its Request, and how many of its blocks and tokens the
        # connector has seen
        self._requests, self._blocks_seen, self._tokens_seen = {}, {}, {}
        self._delayed = set()  # finished, blocks kept until the worker's finished_sending
        # worker: layer name -> index, reports and load errors since the last step
        self._layers, self._reports, self._load_errors = {}, [], set()
        if role.name == "SCHEDULER":
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

    def _open(self, role, **shape):
        self.manager = kvtier.Manager(g3_path=self._g3_path, page_size=self._page_size,
                                      g1_blocks=1, **shape, **self._manager_config)
        try:
            self.connector = kvtier.Connector(self.manager, role=role,
                                              num_gpu_blocks=self._num_gpu_blocks,
                                              **self._connector_config)
        except BaseException:
            self.manager.close()
            raise

    def _live(self):
        if self.connector is None:
            raise kvtier.StateError("kvtier.vllm: register_kv_caches comes first on a worker",
                                    kvtier.CONST["KVT_ERR_STATE"])
        return self.connector

    def shutdown(self):
        if self.manager is not None:
            self.manager.close()  # closes the connector first
        self.manager = self.connector = None

    # ---- scheduler side ----

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        rid = request.request_id
        tokens = list(request.all_token_ids)
        n, is_async = self._live().get_num_new_matched_tokens(rid, tokens, num_computed_tokens)
        self._requests[rid] = request
        self._tokens_seen[rid] = len(tokens)
        self._blocks_seen.pop(rid, None)  # a new admission: update_state_after_alloc follows
        return n, bool(is_async and n)

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        rid = request.request_id
        if rid in self._blocks_seen:
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
            c.request_preempted(rid)
        reqs, num_tokens = [], scheduler_output.num_scheduled_tokens
        for new in scheduler_output.scheduled_new_reqs:
            ids = list(new.block_ids[0]) if new.block_ids else []
            seen, self._blocks_seen[new.req_id] = self._blocks_seen.get(new.req_id, 0), len(ids)
            reqs.append(kvtier.ScheduledRequest(
                new.req_id, new.num_computed_tokens, num_tokens.get(new.req_id, 0), ids[seen:],
                self._new_tokens(new.req_id)))
        cached = scheduler_output.scheduled_cached_reqs
        for i, rid in enumerate(cached.req_ids):
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
        return KvtierConnectorMetadata(c.build_connector_meta(reqs), preempted)

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
        for d in (self._requests, self._blocks_seen, self._tokens_seen):
            d.pop(rid, None)
        try:
            delay_free = self._live().request_finished(rid)
        except kvtier.NotFoundError:  # aborted before the connector saw it
            return False, None
        if delay_free:
            self._delayed.add(rid)
        return delay_free, None

    def take_events(self):
        """G2/G3's BLOCK_STORED/REMOVED events, as vLLM's BlockStored/BlockRemoved when vLLM
        is installed, else as kvtier.Event."""
        events = [e for e in self._live().take_events()
                  if e.type in (kvtier.BLOCK_STORED, kvtier.BLOCK_REMOVED)]
        try:
            kv_events = importlib.import_module("vllm.distributed.kv_events")
        except ImportError:
            return events
        medium = {kvtier.G2: "CPU", kvtier.G3: "DISK"}
        return [kv_events.BlockStored(
                    block_hashes=[e.hash], parent_block_hash=e.parent_hash or None, token_ids=[],
                    block_size=self._page_size, lora_id=None, medium=medium.get(e.tier),
                    lora_name=None)
                if e.type == kvtier.BLOCK_STORED else
                kv_events.BlockRemoved(block_hashes=[e.hash], medium=medium.get(e.tier))
                for e in events]

    # ---- worker side ----

    def register_kv_caches(self, kv_caches):
        names, num_outer, chunk_bytes, layout = _g1_layout(kv_caches, self._num_gpu_blocks)
        self._open(kvtier.ROLE_WORKER, num_layers=len(names), num_outer=num_outer,
                   chunk_bytes=chunk_bytes)
        self.connector.register_kv_caches(layout, self._num_gpu_blocks)
        self._layers = {name: i for i, name in enumerate(names)}

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
