"""kvtier.vllm with a Mamba hybrid, judged by vLLM's own code: vLLM's Scheduler and
KVCacheManager with the hybrid KV cache manager on, two KV cache groups (full attention on
the even layers, Mamba on the odd ones, tensor i shared by layer i of each group, the Mamba
page padded to the attention page), vLLM's own FullAttentionManager and MambaManager deciding
the GPU prefix hits, block tables and frees, in mamba_cache_mode 'all' and 'align'.

The worker's Mamba layers run as vLLM's do: no layer hooks (vLLM wraps only attention ops
with wait_for_layer_load and save_kv_layer), and in 'align' the previous state block is
copied forward before the connector's start_load_kv. Each Mamba layer checks the state it
starts from: it must be the state after exactly the request's computed tokens.

Run: KVTIER_LIB_DIR=build/src VLLM_SRC=../shared/vllm python3 -m pytest \
        bindings/python/tests/test_vllm_mamba.py"""
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import vllm_harness as H  # noqa: E402

H.skip_module_without_vllm("the Mamba-hybrid tests in which vLLM's own scheduler judges "
                           "kvtier.vllm")

BS = 16
LAYERS = tuple("model.layers.%d.self_attn.attn" % i for i in range(4))
MODES = pytest.mark.parametrize("mode", ["all", "align"])
SCHED = pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])


@pytest.fixture(scope="module", autouse=True)
def vllm():
    V = H.setup()
    yield V
    H.teardown()


@pytest.fixture
def make(tmp_path):
    """make(mode, engine=dict(...), **extra): a Mamba hybrid in mamba_cache_mode `mode`."""
    with H.engines(tmp_path, layers=LAYERS) as base:
        def factory(mode, engine=None, **extra):
            return base(dict(dict(mamba=mode), **(engine or {})), **extra)

        yield factory


prompt = H.prompt


def group_stats(e, g):
    return e.connector._groups[g].connector.stats()


def checked(e):
    """The worker's checks so far (state reads included), over every rank."""
    if e.world > 1:
        return sum(q["checked_positions"] for q in e.worker.query("checked_positions"))
    return e.worker.checked_positions


@MODES
def test_mamba_group_is_served(make, vllm, mode):
    """kvtier.vllm keeps vLLM's hybrid KV cache manager on for a Mamba hybrid: one kvtier
    connector per group, the Mamba one with a window of 2 tokens (a hit needs one state
    block; vLLM frees a state block once the request is a token past it), and every hit
    loads asynchronously."""
    e = make(mode)
    assert e.cfg.scheduler_config.disable_hybrid_kv_cache_manager is False
    assert e.kv_cache_config.has_mamba_layers
    assert [(g.kind, g.window, g.connector_window) for g in e.connector._groups] == [
        ("full_attention", 0, 0), ("mamba", 0, 2)]
    assert e.connector._connector_config["load_async"] is True


def hit_loads_one_state_block(e, seed):
    """A computes 150 tokens; kvtier stores its 9 full attention blocks and the Mamba state
    blocks A passed. After the GPU prefix cache is reset, B (A's first 144 tokens and more)
    hits all 144 in kvtier: the attention group loads 9 blocks, the Mamba group the one
    state block after 144 tokens, and B's Mamba layers start from A's state."""
    a = prompt(seed, 150)
    e.add_request("A", a, max_tokens=3)
    e.run()
    assert e.sched.reset_prefix_cache()
    before = checked(e)
    e.add_request("B", a[:144] + [5, 6, 7], max_tokens=3)
    e.run()
    assert e.hits["B"] == (0, 144), e.hits["B"]
    for g in e.connector._groups:  # 9 attention blocks, and each Mamba group's state
        assert group_stats(e, g.index)["loaded_blocks"] == (1 if g.kind == "mamba" else 9)
    assert checked(e) > before
    assert not e.worker.errors
    e.assert_outputs("A", "B")
    e.assert_drained()


@MODES
@SCHED
def test_prefix_from_kvtier_loads_one_state_block(make, mode, async_scheduling):
    """hit_loads_one_state_block with one worker, sync and async scheduling."""
    hit_loads_one_state_block(make(mode, engine=dict(async_scheduling=async_scheduling,
                                                     num_gpu_blocks=60)), 1)


@MODES
@pytest.mark.parametrize("mamba_first", [False, True], ids=["attention_first", "mamba_first"])
def test_several_mamba_groups_in_either_order(make, mode, mamba_first):
    """The shape of Jamba and Nemotron-H: more Mamba layers than attention layers, so
    vLLM makes several Mamba groups (here 2, over 6 layers: 0 and 3 attend), and lists
    them before the attention group or after it. Each Mamba group stores and loads its own
    state block; the groups agree on one hit."""
    layers = tuple("model.layers.%d.mixer" % i for i in range(6))
    e = make(mode, engine=dict(num_gpu_blocks=80, layers=layers, mamba_groups=2,
                               mamba_first=mamba_first))
    kinds = [g.kind for g in e.connector._groups]
    assert kinds == (["mamba", "mamba", "full_attention"] if mamba_first
                     else ["full_attention", "mamba", "mamba"]), kinds
    hit_loads_one_state_block(e, 11)


@pytest.mark.parametrize("shape", [dict(tp=2), dict(pp=2)], ids=["tp2", "pp2"])
def test_mamba_hybrid_in_worker_processes(make, shape):
    """hit_loads_one_state_block in two worker processes: each rank's state shard (its
    heads under TP, its stage's Mamba layers under PP) is stored and loaded as its own."""
    hit_loads_one_state_block(make("all", engine=dict(num_gpu_blocks=60, **shape)), 5)


@MODES
@SCHED
def test_states_passed_in_decode_are_stored_while_blocks_are_reused(make, mode,
                                                                    async_scheduling):
    """A decodes 60 tokens in a small pool beside B: vLLM frees A's passed state blocks
    as it runs (without telling the connector) and hands them to B. Every state block A
    passed in decode is stored before that, with A's state; C (A's prompt and output) then
    hits beyond A's prompt and starts from A's state there."""
    e = make(mode, engine=dict(async_scheduling=async_scheduling, num_gpu_blocks=16))
    mamba = e.sched.kv_cache_manager.coordinator.single_type_managers[1]
    a = prompt(2, 40)
    e.add_request("A", a, max_tokens=60)
    held = set()

    def a_holds(e):
        held.update(b.block_id for b in mamba.req_to_blocks.get("A", ()) if not b.is_null)
        return len(e.outputs["A"]) >= 20

    e.run(a_holds)
    e.add_request("B", prompt(3, 40), max_tokens=30)
    reused = set()

    def b_runs(e):
        a_holds(e)
        if "A" in e.sched.requests:
            reused.update(b.block_id for g in e.sched.kv_cache_manager.get_blocks("B").blocks
                          for b in g if b.block_id in held)
        return not e.has_work()

    e.run(b_runs)
    assert reused, "vLLM handed B none of A's blocks while A ran: this tests nothing"
    assert e.sched.reset_prefix_cache()
    c = a + list(e.outputs["A"][:60]) + [1, 2]
    e.add_request("C", c, max_tokens=2)
    e.run()
    assert e.hits["C"] == (0, 96), e.hits["C"]  # the last boundary A passed: 100 tokens
    assert not e.worker.errors
    e.assert_outputs("A", "B", "C")
    e.assert_drained()


def test_a_diverged_local_hit_gets_its_state_from_kvtier(make, vllm):
    """vLLM's get_computed_blocks_for_connector for a Mamba hybrid: the GPU holds A's
    attention blocks up to 144 tokens but A's Mamba states only up to 64 (the others
    evicted), so vLLM asks the connector from 144 (hit_diverged). kvtier finds the rest of
    A's 192 tokens and the state after 192: B's Mamba group gets a fresh block for it, and
    B's Mamba layers start from A's state there, not from a state vLLM lacks."""
    e = make("all", engine=dict(num_gpu_blocks=60))
    a = prompt(7, 200)
    e.add_request("A", a, max_tokens=2)
    e.run()
    pool = e.sched.kv_cache_manager.block_pool
    hashes = vllm.Request(request_id="h", prompt_token_ids=a,
                          sampling_params=H.SamplingParams(max_tokens=1), pooling_params=None,
                          block_hasher=e.block_hasher).block_hashes
    for group, blocks in ((0, range(9, 12)), (1, range(4, 12))):
        for j in blocks:
            key = vllm.kv_cache_utils.make_block_hash_with_group_id(hashes[j], group)
            pool.evict_blocks(list(pool.cached_block_hash_to_block.get(key, {})))
    before = checked(e)
    e.add_request("B", a[:192] + [5, 6, 7], max_tokens=2)
    e.run()
    assert e.hits["B"] == (144, 48), e.hits["B"]
    assert group_stats(e, 0)["loaded_blocks"] == 3
    assert group_stats(e, 1)["loaded_blocks"] == 1
    assert checked(e) > before
    assert not e.worker.errors
    e.assert_outputs("A", "B")
    e.assert_drained()


def test_events_carry_the_mamba_group(make, vllm):
    """KV events name the Mamba group's state blocks as vLLM's GPU events name them:
    group_idx 1, spec kind 'mamba', no sliding window, the block's hash and tokens."""
    e = make("all")
    e.add_request("A", prompt(4, 40), max_tokens=2)
    e.run()
    stored = [ev for ev in e.events() if isinstance(ev, vllm.kv_events.BlockStored)]
    by_group = {}
    for ev in stored:
        by_group.setdefault(ev.group_idx, set()).add(
            (ev.kv_cache_spec_kind, ev.kv_cache_spec_sliding_window, ev.block_size))
    assert by_group == {0: {("full_attention", None, BS)}, 1: {("mamba", None, BS)}}, by_group
    hashes = {g: sorted(str(h) for ev in stored if ev.group_idx == g for h in ev.block_hashes)
              for g in (0, 1)}
    assert hashes[0] == hashes[1] and len(hashes[0]) == 2


def test_lazy_offload_with_mamba_is_refused(vllm, tmp_path):
    with pytest.raises(ValueError, match="lazy.*Mamba"):
        H.Engine(dict(g2_blocks=8, g3_path=str(tmp_path), offload="lazy"), layers=LAYERS,
                 mamba="all")


def test_mamba_specs_kvtier_cannot_serve_are_refused(vllm):
    """No prefix caching (mamba_cache_mode 'none': no state at block boundaries) and
    speculative blocks (which move state blocks within the table) are ValueErrors that say
    why."""
    kci, torch = vllm.kv_cache_interface, sys.modules["torch"]

    def spec(**kw):
        return kci.MambaSpec(block_size=BS, shapes=((4,),), dtypes=(torch.float16,), **kw)

    with pytest.raises(ValueError, match="mamba_cache_mode 'none'.*enable-prefix-caching"):
        vllm.kvtier_vllm._spec_kind(spec(), "KV cache group 1")
    with pytest.raises(ValueError, match="2 speculative blocks"):
        vllm.kvtier_vllm._spec_kind(spec(mamba_cache_mode="all", num_speculative_blocks=2),
                                    "KV cache group 1")
    for mode in ("all", "align"):
        assert vllm.kvtier_vllm._spec_kind(spec(mamba_cache_mode=mode), "g") == ("mamba", 0)


def test_mamba_hits_are_vllms(vllm):
    """kvtier's hit for a Mamba group equals vLLM's own MambaManager.find_longest_cache_hit
    over the same state blocks present (vLLM's GPU prefix cache standing for kvtier's G2),
    for 200 random sets: the deepest present block wins, whatever lies before it."""
    torch, kci = sys.modules["torch"], vllm.kv_cache_interface
    spec = kci.MambaSpec(block_size=BS, shapes=((4,),), dtypes=(torch.float16,),
                         mamba_cache_mode="all")
    seen = H.assert_hits_match_vllms(vllm.MambaManager, spec, 2, seed=3,
                                     keeps=[0.05, 0.2, 0.5])
    assert len(seen) >= 5, seen


def _mamba_worker(vllm, tmp_path, state_dtype):
    """A worker connector of a Mamba hybrid with a persistent G3 file per group, whose
    Mamba state is float16 or float32 (the same page size), its KV caches registered."""
    import dataclasses
    torch = sys.modules["torch"]
    cfg = H.make_vllm_config(
        dict(store_tier="G3", g2_blocks=0, g3_blocks=8, g3_path=str(tmp_path),
             manager=dict(g3_persist=1)),
        async_scheduling=True, block_size=BS, num_gpu_blocks=8, max_model_len=256,
        max_num_batched_tokens=64, max_num_seqs=2, num_spec_tokens=0, kv_events=False,
        kv_load_failure_policy="recompute", mamba_cache_mode="all")
    kcc = H.rank_kv_cache_config(0, 8, BS, 4, 8, list(LAYERS), mamba="all")[0]
    mamba = kcc.kv_cache_groups[1]
    if state_dtype == "float32":
        heads, n = mamba.kv_cache_spec.shapes[0]
        mamba.kv_cache_spec = dataclasses.replace(
            mamba.kv_cache_spec, shapes=((heads, n // 2),), dtypes=(torch.float32,))
    w = vllm.KVConnectorFactory.create_connector(
        config=cfg, role=vllm.base.KVConnectorRole.WORKER, kv_cache_config=kcc)
    try:
        w.register_kv_caches(H.allocate_kv_caches(kcc, list(LAYERS)))
    except BaseException:
        w.shutdown()
        raise
    return w


def test_persistent_g3_of_another_state_dtype_is_refused(vllm, tmp_path):
    """A Mamba group's G3 namespace folds in its state's shapes and dtypes: a persistent G3
    file written with float16 states is refused (naming g3_namespace) by a deployment whose
    states are float32 with the same page size, never read as its states; the attention
    group's file still opens, and the float16 deployment reopens both."""
    _mamba_worker(vllm, tmp_path, "float16").shutdown()
    assert (tmp_path / "group-1" / "kvtier-g3.bin").is_file()
    with pytest.raises(ValueError, match="g3_namespace"):
        _mamba_worker(vllm, tmp_path, "float32").shutdown()
    _mamba_worker(vllm, tmp_path, "float16").shutdown()
