"""kvtier.vllm driven as vLLM's scheduler and model runner drive a KV connector, without
vLLM: stand-ins carry the attribute names of vLLM's Request, KVCacheBlocks, SchedulerOutput
(NewRequestData, CachedRequestData) and KVConnectorOutput (see docs/VLLM.md for the
version), and the KV caches are host memory behind a tensor stand-in (data_ptr, stride,
shape, element_size, numel, device). Seed 003's requests A and B, then C to read G2 back."""
import dataclasses
import importlib
import pickle
import sys
import time
import types

import pytest

from test_connector import HASH_A, HASH_B, STATES_A, STATES_B, seed  # puts kvtier on sys.path
import kvtier  # noqa: E402
import kvtier.vllm  # noqa: E402

NUM_BLOCKS, PAGE = seed.NUM_GPU_BLOCKS, seed.PAGE
LAYERS = ["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"]


# ---- stand-ins with vLLM's attribute names ----

class ConstantList:
    """vllm.v1.utils.ConstantList: a read-only view of a list."""

    def __init__(self, x):
        self._x = x

    def __getitem__(self, i):
        return self._x[i]

    def __len__(self):
        return len(self._x)

    def __iter__(self):
        return iter(self._x)


class Request:
    """vllm.v1.request.Request, the attributes a connector reads."""

    def __init__(self, request_id, prompt_token_ids):
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self._output_token_ids, self._all_token_ids = [], list(prompt_token_ids)
        self.output_token_ids = ConstantList(self._output_token_ids)
        self.all_token_ids = ConstantList(self._all_token_ids)
        self.num_computed_tokens = 0
        self.num_output_placeholders = 0
        self.cache_salt, self.lora_request, self.mm_features = None, None, []

    @property
    def num_tokens(self):
        return len(self._all_token_ids)

    def append_output_token_ids(self, token_ids):
        self._output_token_ids.append(token_ids)
        self._all_token_ids.append(token_ids)


@dataclasses.dataclass
class KVCacheBlock:
    block_id: int


@dataclasses.dataclass
class KVCacheBlocks:
    """vllm.v1.core.kv_cache_manager.KVCacheBlocks: blocks[group][i]."""
    blocks: tuple

    def get_block_ids(self, allow_none=False):
        return tuple([b.block_id for b in group] for group in self.blocks)


def kv_blocks(ids):
    return KVCacheBlocks(([KVCacheBlock(i) for i in ids],))


@dataclasses.dataclass
class NewRequestData:
    req_id: str
    prompt_token_ids: list
    mm_features: list
    sampling_params: object
    pooling_params: object
    block_ids: tuple
    num_computed_tokens: int
    lora_request: object


@dataclasses.dataclass
class CachedRequestData:
    req_ids: list
    resumed_req_ids: set
    new_token_ids: list
    all_token_ids: dict
    new_block_ids: list
    num_computed_tokens: list
    num_output_tokens: list

    @classmethod
    def make_empty(cls):
        return cls([], set(), [], {}, [], [], [])


@dataclasses.dataclass
class SchedulerOutput:
    scheduled_new_reqs: list
    scheduled_cached_reqs: CachedRequestData
    num_scheduled_tokens: dict
    total_num_scheduled_tokens: int
    scheduled_spec_decode_tokens: dict
    scheduled_encoder_inputs: dict
    num_common_prefix_blocks: list
    finished_req_ids: set
    free_encoder_mm_hashes: list
    preempted_req_ids: set = None
    kv_connector_metadata: object = None


def scheduler_output(new=(), cached=None, finished=(), preempted=None):
    """new: (Request, block ids); cached: a CachedRequestData; num_scheduled_tokens from
    the requests' scheduled tokens, set by the caller in `scheduled`."""
    return SchedulerOutput(
        scheduled_new_reqs=[NewRequestData(r.request_id, r.prompt_token_ids, [], None, None,
                                           (list(ids),), r.num_computed_tokens, None)
                            for r, ids in new],
        scheduled_cached_reqs=cached or CachedRequestData.make_empty(),
        num_scheduled_tokens={}, total_num_scheduled_tokens=0,
        scheduled_spec_decode_tokens={}, scheduled_encoder_inputs={},
        num_common_prefix_blocks=[0], finished_req_ids=set(finished),
        free_encoder_mm_hashes=[], preempted_req_ids=preempted)


@dataclasses.dataclass
class KVConnectorOutput:
    finished_sending: set = None
    finished_recving: set = None
    kv_connector_stats: object = None
    kv_cache_events: object = None
    kv_connector_worker_meta: object = None
    invalid_block_ids: set = dataclasses.field(default_factory=set)
    expected_finished_count: int = 0


class HostTensor:
    """A torch.Tensor stand-in over host memory: (2, num_blocks, block_size, heads, head_size)
    as FlashAttention lays out one layer, 2-byte elements."""

    def __init__(self, shape, element_size=2):
        self.shape, self._el = tuple(shape), element_size
        self.buf = bytearray(self.numel() * element_size)
        self._ptr = int(kvtier.ffi.cast("uintptr_t", kvtier.ffi.from_buffer(self.buf)))
        self._strides = [1] * len(shape)
        for d in reversed(range(len(shape) - 1)):
            self._strides[d] = self._strides[d + 1] * shape[d + 1]
        self.device = types.SimpleNamespace(type="cpu", index=None)

    def numel(self):
        n = 1
        for s in self.shape:
            n *= s
        return n

    def data_ptr(self):
        return self._ptr

    def stride(self, d):
        return self._strides[d]

    def element_size(self):
        return self._el

    def chunk(self, outer, block):
        """The bytes of one block's K (outer 0) or V (outer 1)."""
        off = (outer * self._strides[0] + block * self._strides[1]) * self._el
        return self.buf, off, self._strides[1] * self._el


class Engine:
    """The worker's KV caches: one tensor per layer; the KV of a block is seed.kv(h) split
    over (layer, outer) chunks in order, 256 bytes each."""

    def __init__(self):
        self.kv_caches = {name: HostTensor((2, NUM_BLOCKS, PAGE, 1, 8)) for name in LAYERS}

    def _chunks(self, block):
        for t in self.kv_caches.values():
            for outer in range(2):
                yield t.chunk(outer, block)

    def block(self, b):
        return b"".join(bytes(buf[off:off + n]) for buf, off, n in self._chunks(b))

    def forward(self, writes):
        for b, h in writes:
            data = seed.kv(h)
            for i, (buf, off, n) in enumerate(self._chunks(b)):
                buf[off:off + n] = data[i * n:(i + 1) * n]


def vllm_config(**extra):
    extra = dict(dict(g2_blocks=50), **extra)
    return types.SimpleNamespace(
        kv_transfer_config=types.SimpleNamespace(
            kv_connector="KvtierConnector", kv_connector_module_path="kvtier.vllm",
            kv_role="kv_both", kv_connector_extra_config=extra, engine_id="0"),
        cache_config=types.SimpleNamespace(block_size=PAGE, enable_prefix_caching=True),
        parallel_config=types.SimpleNamespace(world_size=1))


def create_connector(config, role):
    """As vLLM's KVConnectorFactory does for a connector given by module path."""
    tc = config.kv_transfer_config
    cls = getattr(importlib.import_module(tc.kv_connector_module_path), tc.kv_connector)
    return cls(config, role, types.SimpleNamespace(num_blocks=NUM_BLOCKS))


class Engines:
    """vLLM's scheduler-side connector and one worker's, with the worker's KV caches."""

    def __init__(self, **extra):
        config = vllm_config(**extra)
        self.sched = create_connector(config, kvtier.vllm.KVConnectorRole.SCHEDULER)
        self.worker = create_connector(config, kvtier.vllm.KVConnectorRole.WORKER)
        self.engine = Engine()
        self.worker.register_kv_caches(self.engine.kv_caches)

    def close(self):
        self.worker.shutdown()
        self.sched.shutdown()

    def execute(self, so, writes, after_load=None):
        """The model runner's step: metadata crosses to the worker pickled, as in vLLM."""
        so.kv_connector_metadata = pickle.loads(pickle.dumps(self.sched.build_connector_meta(so)))
        w = self.worker
        w.handle_preemptions(so.kv_connector_metadata)
        w.bind_connector_metadata(so.kv_connector_metadata)
        w.start_load_kv(None)
        seen = None
        for name in LAYERS:
            w.wait_for_layer_load(name)
            if seen is None and after_load:
                seen = after_load()
        self.engine.forward(writes)
        for name in LAYERS:
            w.save_kv_layer(name, self.engine.kv_caches[name], None)
        w.wait_for_save()
        out = self.output(so.finished_req_ids)
        w.clear_connector_metadata()
        self.sched.update_connector_output(out)
        return seen, out

    def output(self, finished_req_ids=frozenset()):
        w = self.worker
        sending, recving = w.get_finished(set(finished_req_ids))
        return KVConnectorOutput(
            finished_sending=sending, finished_recving=recving,
            invalid_block_ids=w.get_block_ids_with_load_errors(),
            kv_connector_worker_meta=pickle.loads(pickle.dumps(w.build_connector_worker_meta())))

    def settle(self, stored, loaded):
        """Steps without work until the scheduler has the worker's stores and loads."""
        outs = []

        def finished():
            out = self.output()
            outs.append(out)
            return kvtier.Finished(sorted(out.finished_sending or ()),
                                   sorted(out.finished_recving or ()),
                                   sorted(out.invalid_block_ids), out)

        seed.drain(finished, lambda out: self.sched.update_connector_output(out),
                   self.sched.connector.stats, stored, loaded)
        return outs


@pytest.fixture
def engines():
    e = Engines()
    yield e
    e.close()


def test_loaded_by_module_path_without_vllm():
    assert kvtier.vllm.KvtierConnector.__module__ == "kvtier.vllm"
    if "vllm.distributed" not in sys.modules:  # the stand-in base
        assert issubclass(kvtier.vllm.KvtierConnectorMetadata, kvtier.vllm.KVConnectorMetadata)
    assert kvtier.vllm.KvtierConnector.requires_piecewise_for_cudagraph({}) is True
    W = kvtier.vllm.KvtierWorkerMetadata
    assert W([b"a"]).aggregate(W([b"b"])).reports == [b"a", b"b"]


def test_seed003_through_the_vllm_connector(engines):
    e, S = engines, engines.sched
    assert S.requires_kv_delivery is False
    a = Request("A", seed.TOKENS_A)
    assert S.get_num_new_matched_tokens(a, 0) == (0, False)
    S.update_state_after_alloc(a, kv_blocks([1, 2, 3]), 0)
    so = scheduler_output(new=[(a, [1, 2, 3])])
    so.num_scheduled_tokens = {"A": 40}
    _, out = e.execute(so, [(1, HASH_A[0]), (2, HASH_A[1])])
    assert isinstance(so.kv_connector_metadata, kvtier.vllm.KvtierConnectorMetadata)
    assert isinstance(so.kv_connector_metadata.meta, bytes) and so.kv_connector_metadata.meta
    assert out.invalid_block_ids == set()
    a.num_computed_tokens = 40
    e.settle(stored=2, loaded=0)
    assert S.request_finished(a, [1, 2, 3]) == (False, None)
    assert S.connector.slot_state("A") == (kvtier.SLOT_FINISHED, STATES_A)

    b = Request("B", seed.TOKENS_B)
    assert S.get_num_new_matched_tokens(b, 0) == (32, False)
    S.update_state_after_alloc(b, kv_blocks([4, 5, 6, 7]), 32)
    b.num_computed_tokens = 32
    so = scheduler_output(new=[(b, [4, 5, 6, 7])])
    so.num_scheduled_tokens = {"B": 20}
    seen, out = e.execute(so, [(6, HASH_B[2])],
                          after_load=lambda: [e.engine.block(4), e.engine.block(5)])
    assert seen == [e.engine.block(1), e.engine.block(2)] == [seed.kv(h) for h in HASH_A]
    recving = set(out.finished_recving or ())
    for later in e.settle(stored=3, loaded=2):
        recving |= later.finished_recving or set()
        assert later.invalid_block_ids == set()
    assert recving == {"B"}
    b.num_computed_tokens = 52
    b.append_output_token_ids(3000)

    # B decodes: a cached request; the sampled token reaches kvtier from the Request.
    so = scheduler_output(cached=CachedRequestData(
        req_ids=["B"], resumed_req_ids=set(), new_token_ids=[[]], all_token_ids={},
        new_block_ids=[None], num_computed_tokens=[52], num_output_tokens=[1]))
    so.num_scheduled_tokens = {"B": 1}
    e.execute(so, [])
    e.settle(stored=3, loaded=2)
    assert S.request_finished(b, [4, 5, 6, 7]) == (False, None)
    assert S.connector.slot_state("B") == (kvtier.SLOT_FINISHED, STATES_B)

    stored = [ev.hash for ev in S.take_events() if ev.type == kvtier.BLOCK_STORED]
    assert sorted(stored) == sorted(HASH_B)

    # G2 holds B's three blocks: C loads them into fresh blocks, byte for byte.
    c = Request("C", seed.TOKENS_B[:48] + [4000])
    assert S.get_num_new_matched_tokens(c, 0) == (48, False)
    S.update_state_after_alloc(c, kv_blocks([8, 9, 10, 11]), 48)
    c.num_computed_tokens = 48
    so = scheduler_output(new=[(c, [8, 9, 10, 11])])
    so.num_scheduled_tokens = {"C": 1}
    seen, _ = e.execute(so, [], after_load=lambda: [e.engine.block(b) for b in (8, 9, 10)])
    assert seen == [seed.kv(h) for h in HASH_B]
    e.settle(stored=3, loaded=5)
    assert S.request_finished(c, [8, 9, 10, 11]) == (False, None)


def test_async_load_ends_between_steps():
    """load_async: B waits for its load (WAITING_FOR_REMOTE_KVS in vLLM) while the step runs
    without it, until the worker lists it in finished_recving; then vLLM schedules it."""
    e = Engines(load_async=True)
    try:
        S = e.sched
        a = Request("A", seed.TOKENS_A)
        S.get_num_new_matched_tokens(a, 0)
        S.update_state_after_alloc(a, kv_blocks([1, 2, 3]), 0)
        so = scheduler_output(new=[(a, [1, 2, 3])])
        so.num_scheduled_tokens = {"A": 40}
        e.execute(so, [(1, HASH_A[0]), (2, HASH_A[1])])
        e.settle(stored=2, loaded=0)
        S.request_finished(a, [1, 2, 3])

        b = Request("B", seed.TOKENS_B)
        assert S.get_num_new_matched_tokens(b, 0) == (32, True)
        S.update_state_after_alloc(b, kv_blocks([4, 5]), 32)  # blocks for the load only
        b.num_computed_tokens = 32
        _, out = e.execute(scheduler_output(), [])  # B is not scheduled: its load runs
        recving = set(out.finished_recving or ())
        for later in e.settle(stored=2, loaded=2):
            recving |= later.finished_recving or set()
        assert recving == {"B"}
        assert [e.engine.block(4), e.engine.block(5)] == [seed.kv(h) for h in HASH_A]

        # Scheduled now: vLLM's second update_state_after_alloc brings the new blocks.
        S.update_state_after_alloc(b, kv_blocks([6, 7]), 0)
        so = scheduler_output(new=[(b, [4, 5, 6, 7])])
        so.num_scheduled_tokens = {"B": 20}
        e.execute(so, [(6, HASH_B[2])])
        e.settle(stored=3, loaded=2)
        assert S.request_finished(b, [4, 5, 6, 7]) == (False, None)
        assert S.connector.slot_state("B")[1][:4] == STATES_B[:4]
    finally:
        e.close()


def test_finished_during_its_async_load():
    """B finishes while its load runs: vLLM keeps its blocks, and keeps stepping
    (has_pending_push_work) until the worker lists B in finished_sending."""
    e = Engines(load_async=True)
    try:
        S = e.sched
        a = Request("A", seed.TOKENS_A)
        S.get_num_new_matched_tokens(a, 0)
        S.update_state_after_alloc(a, kv_blocks([1, 2, 3]), 0)
        so = scheduler_output(new=[(a, [1, 2, 3])])
        so.num_scheduled_tokens = {"A": 40}
        e.execute(so, [(1, HASH_A[0]), (2, HASH_A[1])])
        e.settle(stored=2, loaded=0)
        assert S.request_finished(a, [1, 2, 3]) == (False, None)
        assert not S.has_pending_push_work()

        b = Request("B", seed.TOKENS_B)
        assert S.get_num_new_matched_tokens(b, 0) == (32, True)
        S.update_state_after_alloc(b, kv_blocks([4, 5]), 32)
        so = scheduler_output()
        so.kv_connector_metadata = S.build_connector_meta(so)
        e.worker.bind_connector_metadata(so.kv_connector_metadata)
        e.worker.start_load_kv(None)
        assert S.request_finished(b, [4, 5]) == (True, None)  # aborted during its load
        assert S.has_pending_push_work()
        sending = set()
        for _ in range(1000):  # the engine's steps while B's blocks are held
            e.worker.wait_for_save()
            out = e.output({"B"})
            e.worker.clear_connector_metadata()
            S.update_connector_output(out)
            sending |= out.finished_sending or set()
            if not S.has_pending_push_work():
                break
            so = scheduler_output(finished={"B"})
            so.kv_connector_metadata = S.build_connector_meta(so)
            e.worker.bind_connector_metadata(so.kv_connector_metadata)
            e.worker.start_load_kv(None)
            time.sleep(0.001)
        assert sending == {"B"} and not S.has_pending_push_work()
        assert [e.engine.block(4), e.engine.block(5)] == [seed.kv(h) for h in HASH_A]
    finally:
        e.close()


def test_preemption_reaches_both_halves(engines):
    e, S = engines, engines.sched
    a = Request("A", seed.TOKENS_A)
    S.get_num_new_matched_tokens(a, 0)
    S.update_state_after_alloc(a, kv_blocks([1, 2, 3]), 0)
    so = scheduler_output(new=[(a, [1, 2, 3])])
    so.num_scheduled_tokens = {"A": 16}  # a first chunk of its prefill
    e.execute(so, [(1, HASH_A[0])])
    a.num_computed_tokens = 16
    so = scheduler_output(preempted={"A"})  # the scheduler took its blocks back
    e.execute(so, [])
    assert so.kv_connector_metadata.preempted_req_ids == {"A"}
    assert S.connector.slot_state("A")[0] == kvtier.SLOT_PREEMPTED
    e.settle(stored=1, loaded=0)

    # It comes back: its first block is in G2 now, and loads into its new blocks.
    a.num_computed_tokens = 0
    assert S.get_num_new_matched_tokens(a, 0) == (16, False)
    S.update_state_after_alloc(a, kv_blocks([20, 21, 22]), 16)
    a.num_computed_tokens = 16
    so = scheduler_output(cached=CachedRequestData(
        req_ids=["A"], resumed_req_ids={"A"}, new_token_ids=[[]], all_token_ids={},
        new_block_ids=[([20, 21, 22],)], num_computed_tokens=[16], num_output_tokens=[0]))
    so.num_scheduled_tokens = {"A": 24}
    seen, _ = e.execute(so, [(21, HASH_A[1])], after_load=lambda: e.engine.block(20))
    assert seen == seed.kv(HASH_A[0])
    e.settle(stored=2, loaded=1)
    assert S.request_finished(a, [20, 21, 22]) == (False, None)
    history = S.connector.slot_state("A")[1]
    assert kvtier.SLOT_PREEMPTED in history and history[-1] == kvtier.SLOT_FINISHED


def failing_g3_engines():
    """G3 as the store tier, on a worker whose first G3 read fails with EIO."""
    return Engines(store_tier="G3", g2_blocks=0, g3_blocks=50,
                   manager=dict(g3_fault_op=kvtier.G3_FAULT_READ, g3_fault_errno=5,
                                g3_fault_count=1))


def failed_load_of_b(e):
    """A stores its blocks to G3; B's load of them meets the read error. Returns the step's
    KVConnectorOutput and B's blocks 4 and 5 as they were after the load."""
    S = e.sched
    a = Request("A", seed.TOKENS_A)
    S.get_num_new_matched_tokens(a, 0)
    S.update_state_after_alloc(a, kv_blocks([1, 2, 3]), 0)
    so = scheduler_output(new=[(a, [1, 2, 3])])
    so.num_scheduled_tokens = {"A": 40}
    e.execute(so, [(1, HASH_A[0]), (2, HASH_A[1])])
    e.settle(stored=2, loaded=0)
    S.request_finished(a, [1, 2, 3])

    b = Request("B", seed.TOKENS_B)
    assert S.get_num_new_matched_tokens(b, 0) == (32, False)
    S.update_state_after_alloc(b, kv_blocks([4, 5, 6, 7]), 32)
    b.num_computed_tokens = 32
    so = scheduler_output(new=[(b, [4, 5, 6, 7])])
    so.num_scheduled_tokens = {"B": 20}
    seen, out = e.execute(so, [(6, HASH_B[2])],
                          after_load=lambda: [e.engine.block(4), e.engine.block(5)])
    return out, seen


def test_a_failed_load_is_reported_and_recomputed():
    """B's load from G3 meets an injected read error: the worker reports the block in
    get_block_ids_with_load_errors (vLLM's invalid_block_ids); B recomputed from there
    leaves G3 with B's blocks intact."""
    e = failing_g3_engines()
    try:
        S = e.sched
        out, seen = failed_load_of_b(e)
        bad = out.invalid_block_ids
        assert bad and bad <= {4, 5}  # the first read failed
        assert [seen[i] == seed.kv(HASH_A[i]) for i in range(2)] == [4 + i not in bad
                                                                    for i in range(2)]
        assert out.finished_recving == {"B"}
        s = S.connector.stats()
        assert (s["loaded_blocks"], s["load_errors"]) == (2 - len(bad), len(bad))

        # vLLM's scheduler recomputes from the first failed block: here, all of B.
        so = scheduler_output(cached=CachedRequestData(
            req_ids=["B"], resumed_req_ids=set(), new_token_ids=[[]], all_token_ids={},
            new_block_ids=[None], num_computed_tokens=[0], num_output_tokens=[0]))
        so.num_scheduled_tokens = {"B": 52}
        _, out = e.execute(so, [(4 + i, h) for i, h in enumerate(HASH_B)])
        assert out.invalid_block_ids == set()
        e.settle(stored=3, loaded=2 - len(bad))
        assert S.request_finished(Request("B", seed.TOKENS_B), [4, 5, 6, 7]) == (False, None)

        c = Request("C", seed.TOKENS_B[:48] + [4000])  # G3 holds B's blocks intact
        assert S.get_num_new_matched_tokens(c, 0) == (48, False)
        S.update_state_after_alloc(c, kv_blocks([8, 9, 10, 11]), 48)
        c.num_computed_tokens = 48
        so = scheduler_output(new=[(c, [8, 9, 10, 11])])
        so.num_scheduled_tokens = {"C": 1}
        seen, out = e.execute(so, [], after_load=lambda: [e.engine.block(i) for i in (8, 9, 10)])
        assert seen == [seed.kv(h) for h in HASH_B] and out.invalid_block_ids == set()
    finally:
        e.close()


def test_nothing_computed_over_a_failed_load_is_stored():
    """B's third block is computed in the step whose load of B's first block failed: its KV
    attends to garbage, so it must not be stored (vLLM recomputes it)."""
    e = failing_g3_engines()
    try:
        S = e.sched
        out, _ = failed_load_of_b(e)
        assert 4 in out.invalid_block_ids
        S.request_finished(Request("B", seed.TOKENS_B), [4, 5, 6, 7])
        for _ in range(5000):  # until B's batches are all reported (FINISHED)
            if S.connector.slot_state("B")[0] == kvtier.SLOT_FINISHED:
                break
            S.update_connector_output(e.output())
            time.sleep(0.001)
        assert S.connector.slot_state("B")[0] == kvtier.SLOT_FINISHED
        assert S.connector.stats()["stored_blocks"] == 2
        g3 = S.manager.match_prefix(HASH_B, kvtier.G3)
        S.manager.release(g3)
        assert len(g3) < 3
    finally:
        e.close()


def test_events_become_vllms_when_vllm_is_installed(engines, monkeypatch):
    @dataclasses.dataclass
    class BlockStored:
        block_hashes: list
        parent_block_hash: object
        token_ids: list
        block_size: int
        lora_id: object
        medium: object
        lora_name: object

    @dataclasses.dataclass
    class BlockRemoved:
        block_hashes: list
        medium: object

    stub = types.ModuleType("vllm.distributed.kv_events")
    stub.BlockStored, stub.BlockRemoved = BlockStored, BlockRemoved
    monkeypatch.setitem(sys.modules, "vllm.distributed.kv_events", stub)
    e, S = engines, engines.sched
    a = Request("A", seed.TOKENS_A)
    S.get_num_new_matched_tokens(a, 0)
    S.update_state_after_alloc(a, kv_blocks([1, 2, 3]), 0)
    so = scheduler_output(new=[(a, [1, 2, 3])])
    so.num_scheduled_tokens = {"A": 40}
    e.execute(so, [(1, HASH_A[0]), (2, HASH_A[1])])
    e.settle(stored=2, loaded=0)
    events = S.take_events()
    assert [(ev.block_hashes, ev.parent_block_hash, ev.block_size, ev.medium) for ev in events] \
        == [([HASH_A[0]], None, PAGE, "CPU"), ([HASH_A[1]], HASH_A[0], PAGE, "CPU")]


def test_extra_config_is_checked():
    worker = kvtier.vllm.KVConnectorRole.WORKER
    for bad in (dict(store_tier="G4"), dict(offload="sometimes"), dict(g2_block=5)):
        with pytest.raises(ValueError):
            create_connector(vllm_config(**bad), worker)
    with pytest.raises(ValueError):  # G1's size comes from kv_cache_config or the config
        kvtier.vllm.KvtierConnector(vllm_config(), worker)
    config = vllm_config()
    config.parallel_config.world_size = 2
    with pytest.raises(ValueError):
        create_connector(config, worker)
    w = create_connector(vllm_config(), worker)
    with pytest.raises(kvtier.StateError):  # a worker's KV caches come first
        w.bind_connector_metadata(kvtier.vllm.KvtierConnectorMetadata(b"x"))
    with pytest.raises(ValueError):  # no dimension of NUM_BLOCKS blocks
        w.register_kv_caches({"layer": HostTensor((2, NUM_BLOCKS + 1, PAGE, 1, 8))})
