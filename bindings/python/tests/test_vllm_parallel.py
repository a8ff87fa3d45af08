"""kvtier.vllm with N workers per scheduler (tensor and pipeline parallel), judged by vLLM's
own code: one scheduler connector in this process, inside vLLM's compiled Scheduler, and one
worker connector per rank, each in a process of its own (multiprocessing's "spawn", never
fork: this process has kvtier's threads) over a kvtier.Manager of its own. Only bytes cross
between them: the SchedulerOutput pickled once for every rank (MultiprocExecutor's
broadcast), each rank's ModelRunnerOutput pickled back. vLLM's own KVOutputAggregator
(compiled from kv_connector/utils.py) merges the ranks' KVConnectorOutputs as the executor
does: KVOutputAggregator.from_connector(scheduler connector, world_size), then
aggregate(outputs, output_rank = world_size - TP).

Each rank's KV caches hold its shard: under TP 2 half the KV heads, under PP 2 half the
layers. The forward writes and checks bytes per (token-prefix digest, global layer, global
head), so a shard loaded on the wrong rank, or not loaded, fails the byte check.

Run: KVTIER_LIB_DIR=build/src VLLM_SRC=../shared/vllm python3 -m pytest \\
        bindings/python/tests/test_vllm_parallel.py"""
import collections
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import vllm_harness as H  # noqa: E402

H.skip_module_without_vllm("the tests in which vLLM's own scheduler and KVOutputAggregator "
                           "judge kvtier.vllm with N workers")
import kvtier  # noqa: E402

BS = 16
LAYOUT = pytest.mark.parametrize("tp,pp", [(2, 1), (1, 2)], ids=["tp2", "pp2"])


@pytest.fixture(scope="module", autouse=True)
def vllm():
    V = H.setup()
    yield V
    H.teardown()


@pytest.fixture
def make(tmp_path):
    """make(tp, pp, engine=dict(...), rank_manager=..., **extra): an Engine of world
    tp * pp (g2_blocks 64 and g3_path tmp_path unless given)."""
    with H.engines(tmp_path) as base:
        def factory(tp, pp, engine=None, rank_manager=None, **extra):
            return base(dict(dict(tp=tp, pp=pp, rank_manager=rank_manager), **(engine or {})),
                        **extra)

        yield factory


prompt = H.prompt


def listed(outputs, field, rid):
    """How many of the KVConnectorOutputs list rid in field."""
    return sum(rid in (getattr(o, field, None) or ()) for o in outputs if o is not None)


def rank_column(e, rank):
    """Rank's own KVConnectorOutputs, one per execution (None: an empty one)."""
    return [outs[rank] for outs in e.worker.rank_outputs]


def invalid(outputs):
    return set().union(*(o.invalid_block_ids or () for o in outputs if o is not None))


def assert_counted_once(e):
    """Every rank reports each request's finished_sending / finished_recving at most once
    and as often as every other rank; the aggregated outputs list it as often (once, in the
    step of the last rank), and vLLM's aggregator holds no count at the end."""
    for field in ("finished_sending", "finished_recving"):
        for rid in e.requests:
            per_rank = [listed(rank_column(e, r), field, rid) for r in range(e.world)]
            assert per_rank in ([0] * e.world, [1] * e.world), (field, rid, per_rank)
            assert listed(e.worker.aggregated, field, rid) == per_rank[0], (field, rid)
            assert listed([o for _, o in e.kv_outputs], field, rid) == per_rank[0]
    agg = e.worker.aggregator
    assert agg._send_remaining_count == {} and agg._recv_remaining_count == {}, (
        agg._send_remaining_count, agg._recv_remaining_count)


def rank_reads(e):
    """Per rank: its Worker's request -> positions read below the computed count (each
    one checked, in every layer and KV head of the rank), errors and excused mismatches."""
    return e.worker.query("reads", "errors", "excused", "num_kv_heads", "layers")


def block_hashes(vllm, e, rid, n):
    conv = vllm.kv_cache_utils.maybe_convert_block_hash
    return [conv(h) for h in e.requests[rid].block_hashes[:n]]


def stored_counts(vllm, e):
    return collections.Counter(h for ev in e.events() if isinstance(
        ev, vllm.kv_events.BlockStored) for h in ev.block_hashes)


@LAYOUT
@pytest.mark.parametrize("load_async", [False, True], ids=["load_sync", "load_async"])
def test_prefix_from_kvtier_on_every_rank(make, vllm, tp, pp, load_async):
    """A computes 70 tokens; every rank stores its shard of A's 4 full blocks. The GPU
    prefix cache is reset, and B, with A's first 64 tokens, loads them from kvtier on every
    rank: each rank's forward reads exactly its own shard's bytes at B's 64 loaded
    positions. The scheduler names each block once: one BlockStored per block (not one per
    rank), stored_blocks and loaded_blocks count blocks once; an async load's
    finished_recving comes from each rank once, and from vLLM's aggregator once."""
    e = make(tp, pp, load_async=load_async, engine=dict(async_scheduling=True))
    assert e.world == 2 and e.worker.output_rank == (0 if tp == 2 else 1)
    shards = e.worker.query("num_kv_heads", "layers", "head0", "layer0")
    if tp == 2:
        assert [(q["num_kv_heads"], q["head0"], len(q["layers"])) for q in shards] == \
            [(2, 0, 2), (2, 2, 2)]
    else:
        assert [(q["num_kv_heads"], q["layer0"], q["layers"]) for q in shards] == \
            [(4, 0, [H.Engine.LAYERS[0]]), (4, 1, [H.Engine.LAYERS[1]])]
    a = prompt(1, 70)
    e.add_request("A", a, max_tokens=3)
    e.run()
    assert e.sched.reset_prefix_cache()
    e.add_request("B", a[:64] + [5, 6, 7, 8, 9], max_tokens=3)
    e.run()
    assert e.hits["B"] == (0, 64), "B's prefix hits (GPU, kvtier): %s" % (e.hits["B"],)
    if load_async:
        assert e.status_log["B"][0] == "WAITING_FOR_REMOTE_KVS"
        for r in range(e.world):
            assert listed(rank_column(e, r), "finished_recving", "B") == 1, r
    else:
        assert "WAITING_FOR_REMOTE_KVS" not in e.status_log["B"]
    assert listed([o for _, o in e.kv_outputs], "finished_recving", "B") == int(load_async)
    e.assert_outputs("A", "B")
    e.assert_drained()
    for r, q in enumerate(rank_reads(e)):
        assert not q["errors"] and not q["excused"], (r, q["errors"], q["excused"])
        assert set(range(64)) <= q["reads"]["B"], "rank %d did not read B's loaded KV" % r
    assert not invalid(e.worker.aggregated)
    # one BlockStored per block, for A's 4 blocks (B's loaded blocks are not stored again)
    counts = stored_counts(vllm, e)
    assert set(counts) == set(block_hashes(vllm, e, "A", 4)), counts
    assert set(counts.values()) == {1}, "a block stored more than once: %s" % counts
    stats = e.connector.connector.stats()
    assert (stats["stored_blocks"], stats["loaded_blocks"], stats["load_errors"],
            stats["store_failures"]) == (4, 4, 0, 0), stats
    assert_counted_once(e)
    assert e.connector.connector.batches() == []


@pytest.mark.parametrize("tp,pp,async_scheduling", [(2, 1, False), (1, 2, True)],
                         ids=["tp2-sync", "pp2-async"])
@pytest.mark.parametrize("load_async", [False, True], ids=["load_sync", "load_async"])
def test_load_failing_on_one_rank(make, vllm, tmp_path, tp, pp, async_scheduling, load_async):
    """A stores to G3; B's load of it fails on rank 1 only (rank 1's manager gets G3 fault
    injection: a test device, rank_manager, since vLLM gives every rank the same
    kv_connector_extra_config). Only rank 1's own KVConnectorOutput names invalid blocks;
    vLLM's aggregator hands them to the scheduler, which makes every rank recompute B from
    the first bad block: B ends with the model's tokens and no rank read a wrong byte
    outside the blocks reported. The scheduler counts the failure once (load_errors) and
    removes the failed block once (one BlockRemoved); C, later, loads the blocks B stored
    again and reads the right bytes on both ranks."""
    fault = dict(g3_fault_op=kvtier.G3_FAULT_READ, g3_fault_errno=5, g3_fault_count=1)
    e = make(tp, pp, store_tier="G3", g2_blocks=0, g3_blocks=64, load_async=load_async,
             rank_manager={1: fault}, engine=dict(async_scheduling=async_scheduling))
    for r in range(e.world):  # each rank's G3 file in a directory of its own
        assert (tmp_path / ("rank-%d-of-2" % r)).is_dir()
    a = prompt(40, 70)
    e.add_request("A", a, max_tokens=2)
    e.run()
    assert e.sched.reset_prefix_cache()
    e.add_request("B", a[:64] + [1, 2, 3], max_tokens=3)
    e.run()
    assert e.hits["B"][1] == 64
    bad0, bad1 = invalid(rank_column(e, 0)), invalid(rank_column(e, 1))
    assert not bad0, "rank 0 reported load errors: %s" % bad0
    assert bad1, "rank 1 reported no load error"
    assert invalid(e.worker.aggregated) == bad1
    assert invalid([o for _, o in e.kv_outputs]) == bad1
    if async_scheduling and not load_async:
        e.assert_outputs("A")  # as test_vllm_scheduler's test_failed_g3_load_is_recomputed
    else:
        e.assert_outputs("A", "B")
    e.assert_drained()
    reads = rank_reads(e)
    assert not reads[0]["excused"], "rank 0 read bad KV: %s" % reads[0]["excused"]
    stats = e.connector.connector.stats()
    # once per block, not per rank: the 4 blocks B loaded are loaded or failed; B stored
    # the failed ones again after recomputing them
    assert stats["load_errors"] == len(bad1), (stats, bad1)
    assert stats["loaded_blocks"] + stats["load_errors"] == 4, stats
    assert stats["stored_blocks"] == 4 + len(bad1), stats
    removed = collections.Counter(h for ev in e.events() if isinstance(
        ev, vllm.kv_events.BlockRemoved) for h in ev.block_hashes)
    assert sum(removed.values()) == len(bad1) and set(removed.values()) == {1}, removed
    assert set(removed) <= set(block_hashes(vllm, e, "A", 4))
    counts = stored_counts(vllm, e)
    assert counts == collections.Counter(block_hashes(vllm, e, "A", 4)) + removed, counts
    assert_counted_once(e)
    # the recomputed blocks were stored again: C loads all 4, both ranks read them right
    assert e.sched.reset_prefix_cache()
    e.add_request("C", a[:64] + [4, 5], max_tokens=2)
    e.run()
    assert e.hits["C"] == (0, 64), e.hits["C"]
    e.assert_outputs("C")
    e.assert_drained()
    for r, q in enumerate(rank_reads(e)):
        assert set(range(64)) <= q["reads"]["C"], r
    stats2 = e.connector.connector.stats()
    assert stats2["load_errors"] == len(bad1)
    assert stats2["loaded_blocks"] == stats["loaded_blocks"] + 4, stats2
    assert_counted_once(e)
    assert e.connector.connector.batches() == []


def _rank_worker(vllm, tmp_path, rank, tp=2, pp=1, dp=None):
    """A worker connector of rank `rank` (world tp * pp; of data-parallel engine `dp` of 2
    unless None) with a persistent G3 file, its KV caches registered (which opens its
    manager)."""
    layers = list(H.Engine.LAYERS)
    rcfg = H.make_vllm_config(
        dict(store_tier="G3", g2_blocks=0, g3_blocks=8, g3_path=str(tmp_path),
             manager=dict(g3_persist=1)),
        async_scheduling=True, block_size=BS, num_gpu_blocks=8, max_model_len=256,
        max_num_batched_tokens=64, max_num_seqs=2, num_spec_tokens=0, kv_events=False,
        kv_load_failure_policy="recompute", tensor_parallel_size=tp,
        pipeline_parallel_size=pp, rank=rank)
    if dp is not None:
        rcfg.parallel_config.data_parallel_size = 2
        rcfg.parallel_config.data_parallel_rank = dp
    kcc = H.rank_kv_cache_config(rank, 8, BS, 4, 8, layers, tp=tp, pp=pp)[0]
    w = vllm.KVConnectorFactory.create_connector(
        config=rcfg, role=vllm.base.KVConnectorRole.WORKER, kv_cache_config=kcc)
    try:
        w.register_kv_caches(H.allocate_kv_caches(kcc, kcc.kv_cache_groups[0].layer_names))
    except BaseException:
        w.shutdown()
        raise
    return w


@LAYOUT
def test_persistent_g3_file_of_another_rank_is_refused(vllm, tmp_path, tp, pp):
    """Each worker's persistent G3 file is <g3_path>/rank-<r>-of-<N>/kvtier-g3.bin (so the
    ranks do not contend for one file's lock), in a namespace folded with (rank, world, TP,
    PP). Under TP the ranks' layouts are the same, under PP (equal stages) too: only the
    namespace tells their files apart. With the ranks' files swapped, a worker refuses to
    open the other rank's file (naming g3_namespace) instead of serving its bytes as its own
    shard; swapped back, both open."""
    for rank in (0, 1):
        _rank_worker(vllm, tmp_path, rank, tp, pp).shutdown()
    files = [tmp_path / ("rank-%d-of-2" % r) / "kvtier-g3.bin" for r in (0, 1)]
    assert all(f.is_file() for f in files), sorted(map(str, tmp_path.rglob("*")))
    assert not (tmp_path / "kvtier-g3.bin").exists()
    swap = tmp_path / "swap.bin"
    files[0].rename(swap)
    files[1].rename(files[0])
    swap.rename(files[1])
    for rank in (0, 1):
        with pytest.raises(ValueError, match="g3_namespace"):
            _rank_worker(vllm, tmp_path, rank, tp, pp).shutdown()
    files[0].rename(swap)
    files[1].rename(files[0])
    swap.rename(files[1])
    workers = [_rank_worker(vllm, tmp_path, rank, tp, pp) for rank in (0, 1)]
    for w in workers:
        w.shutdown()


@pytest.mark.parametrize("tp", [1, 2], ids=["tp1", "tp2"])
def test_data_parallel_engines_on_one_host_have_g3_files_of_their_own(vllm, tmp_path, tp):
    """Two data-parallel engines with one g3_path, all their workers alive at once: each
    engine's files are under dp-<data_parallel_rank>, so none fails on another's lock."""
    workers = []
    try:
        for dp in (0, 1):
            for rank in range(tp):
                workers.append(_rank_worker(vllm, tmp_path, rank, tp=tp, dp=dp))
        for dp in (0, 1):
            for rank in range(tp):
                d = tmp_path / ("dp-%d" % dp)
                if tp > 1:
                    d = d / ("rank-%d-of-%d" % (rank, tp))
                assert (d / "kvtier-g3.bin").is_file(), sorted(map(str, tmp_path.rglob("*")))
        assert not (tmp_path / "kvtier-g3.bin").exists()
    finally:
        for w in workers:
            w.shutdown()
