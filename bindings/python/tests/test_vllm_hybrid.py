"""kvtier.vllm with a hybrid model, judged by vLLM's own code: vLLM's Scheduler and
KVCacheManager with its hybrid KV cache manager on (kvtier.vllm is SupportsHMA), two KV cache
groups (full attention on the even layers, a sliding window on the odd ones, tensor i shared
by layer i of each group, as vLLM lays them out), vLLM's own FullAttentionManager and
SlidingWindowManager deciding the GPU prefix hits, and the worker's forward checking every
KV position each layer reads (a sliding-window layer reads only its window).

Run: KVTIER_LIB_DIR=build/src VLLM_SRC=../shared/vllm python3 -m pytest \
        bindings/python/tests/test_vllm_hybrid.py"""
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import vllm_harness as H  # noqa: E402

H.skip_module_without_vllm("the hybrid-model tests in which vLLM's own scheduler judges "
                           "kvtier.vllm")

BS = 16
WINDOW = 40  # tokens: a hit needs cdiv(39, 16) = 3 blocks of the window (vLLM's rule)
LAYERS = tuple("model.layers.%d.self_attn.attn" % i for i in range(4))


@pytest.fixture(scope="module", autouse=True)
def vllm():
    V = H.setup()
    yield V
    H.teardown()


@pytest.fixture
def make(tmp_path):
    with H.engines(tmp_path, layers=LAYERS, sliding_window=WINDOW) as factory:
        yield factory


prompt = H.prompt


def group_stats(e, g):
    return e.connector._groups[g].connector.stats()


SCHED = pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
LOAD = pytest.mark.parametrize("load_async", [False, True], ids=["load_sync", "load_async"])


def test_hybrid_kv_cache_manager_stays_on(make, vllm):
    """vLLM turns its hybrid KV cache manager off for a connector that is not SupportsHMA
    (VllmConfig.__post_init__); kvtier.vllm is, so it stays on and each group gets a kvtier
    connector of its own, the sliding-window one with the window."""
    e = make()
    assert vllm.KVConnectorFactory.supports_hma_config(e.cfg.kv_transfer_config)
    assert e.cfg.scheduler_config.disable_hybrid_kv_cache_manager is False
    assert [(g.kind, g.window) for g in e.connector._groups] == [
        ("full_attention", 0), ("sliding_window", WINDOW)]


def hit_loads_only_the_window(e, seed):
    """A computes 150 tokens; kvtier stores its 9 full blocks in both groups. After the GPU
    prefix cache is reset, B (A's first 144 tokens and more) hits all 144 in kvtier: the
    full-attention group loads its 9 blocks, the sliding-window group only the 3 its window
    reads (vLLM's SlidingWindowManager gives B's earlier blocks the null block), and every
    position each layer reads holds A's bytes."""
    a = prompt(seed, 150)
    e.add_request("A", a, max_tokens=3)
    e.run()
    assert e.sched.reset_prefix_cache()
    e.add_request("B", a[:144] + [5, 6, 7], max_tokens=3)
    e.run()
    assert e.hits["B"] == (0, 144), e.hits["B"]
    assert group_stats(e, 0)["loaded_blocks"] == 9
    assert group_stats(e, 1)["loaded_blocks"] == -(-(WINDOW - 1) // BS)
    assert not e.worker.errors
    e.assert_outputs("A", "B")
    e.assert_drained()


@SCHED
@LOAD
def test_prefix_from_kvtier_loads_only_the_window(make, async_scheduling, load_async):
    """hit_loads_only_the_window with one worker, sync and async scheduling and loads."""
    hit_loads_only_the_window(make(load_async=load_async, engine=dict(
        async_scheduling=async_scheduling, num_gpu_blocks=60)), 1)


@pytest.mark.parametrize("shape", [dict(tp=2), dict(pp=2)], ids=["tp2", "pp2"])
def test_hybrid_layout_in_worker_processes(make, shape):
    """hit_loads_only_the_window with two worker processes (each with its KV heads under TP,
    its stage's full-attention and sliding-window layers under PP), vLLM's
    KVOutputAggregator merging their outputs: only bytes cross between scheduler and
    workers, and every rank's forward reads its shard's bytes."""
    hit_loads_only_the_window(make(engine=dict(num_gpu_blocks=60, **shape)), 5)


@SCHED
def test_long_decode_frees_window_blocks_that_others_reuse(make, async_scheduling):
    """A decodes far past its window in a small pool: vLLM frees A's sliding-window blocks
    as they leave the window (without telling the connector) and hands them to B while A
    still runs. kvtier must neither refuse B's blocks as A's nor store them as A's (B writes
    them in the same step); afterwards C's hit on A's prompt reads A's bytes."""
    e = make(engine=dict(async_scheduling=async_scheduling, num_gpu_blocks=16))
    swa = e.sched.kv_cache_manager.coordinator.single_type_managers[1]
    a = prompt(2, 40)
    e.add_request("A", a, max_tokens=60)
    held = set()  # every sliding-window block A held

    def a_at(n):
        def until(e):
            held.update(b.block_id for b in swa.req_to_blocks.get("A", ()) if not b.is_null)
            return len(e.outputs["A"]) >= n
        return until

    e.run(a_at(40))
    e.add_request("B", prompt(3, 40), max_tokens=20)  # 6 blocks: 1 more than never used
    reused = set()

    def b_runs(e):
        a_at(0)(e)
        if "A" in e.sched.requests:
            reused.update(b.block_id for g in e.sched.kv_cache_manager.get_blocks("B").blocks
                          for b in g if b.block_id in held)
        return not e.has_work()

    e.run(b_runs)
    assert reused, "vLLM handed B none of A's window blocks while A ran: this tests nothing"
    assert e.sched.reset_prefix_cache()
    e.add_request("C", a + list(e.outputs["A"][:60]) + [1, 2], max_tokens=2)
    e.run()
    assert e.hits["C"][1] >= 80, e.hits["C"]
    e.assert_outputs("A", "B", "C")
    e.assert_drained()


def test_events_carry_group_and_spec(make, vllm):
    """KV events name each group's blocks as vLLM's GPU events do: group_idx, the spec kind,
    and the window of a sliding-window group."""
    e = make()
    e.add_request("A", prompt(4, 40), max_tokens=2)
    e.run()
    stored = [ev for ev in e.events() if isinstance(ev, vllm.kv_events.BlockStored)]
    by_group = {}
    for ev in stored:
        by_group.setdefault(ev.group_idx, set()).add(
            (ev.kv_cache_spec_kind, ev.kv_cache_spec_sliding_window, ev.block_size))
    assert by_group == {0: {("full_attention", None, BS)},
                        1: {("sliding_window", WINDOW, BS)}}, by_group
    hashes = {g: sorted(str(h) for ev in stored if ev.group_idx == g for h in ev.block_hashes)
              for g in (0, 1)}
    assert hashes[0] == hashes[1] and len(hashes[0]) == 2  # one hash space, per group


def test_lazy_offload_with_two_groups_is_refused(vllm, tmp_path):
    """A block the sliding window frees can be reused by the other group unseen: lazy
    offload (which stores a block when its reuse shows) would store the new owner's bytes."""
    with pytest.raises(ValueError, match="lazy"):
        H.Engine(dict(g2_blocks=8, g3_path=str(tmp_path), offload="lazy"), layers=LAYERS,
                 sliding_window=WINDOW)


def test_unsupported_spec_is_refused(vllm):
    """A group kvtier cannot serve (chunked-local attention, here) is a ValueError naming
    it."""
    kci = vllm.kv_cache_interface
    torch = sys.modules["torch"]
    local = kci.ChunkedLocalAttentionSpec(block_size=BS, num_kv_heads=1, head_size=8,
                                          dtype=torch.float16, attention_chunk_size=64)
    with pytest.raises(ValueError, match="ChunkedLocalAttentionSpec"):
        vllm.kvtier_vllm._spec_kind(local, "KV cache group 1")


@pytest.mark.parametrize("window", [16, 17, 40, 64, 100])
def test_window_hits_are_vllms(vllm, window):
    """kvtier's hit for a sliding-window group equals vLLM's own
    SlidingWindowManager.find_longest_cache_hit over the same blocks present (vLLM's GPU
    prefix cache standing for kvtier's G2), for 200 random sets of present blocks: runs long
    and short, holes inside and before the window, hits from the first block on."""
    torch, kci = sys.modules["torch"], vllm.kv_cache_interface
    spec = kci.SlidingWindowSpec(block_size=BS, num_kv_heads=1, head_size=8,
                                 dtype=torch.float16, sliding_window=window)
    seen = H.assert_hits_match_vllms(vllm.SlidingWindowManager, spec, window, seed=window,
                                     keeps=[0.3, 0.6, 0.9])
    assert len(seen) >= 5, seen  # hits of many lengths, not all misses or all whole
