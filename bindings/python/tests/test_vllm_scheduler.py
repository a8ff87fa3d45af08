"""kvtier.vllm judged by vLLM's own code: vLLM's Scheduler/AsyncScheduler (compiled from
VLLM_SRC's scheduler.py), KVCacheManager, Request with vLLM's block hasher, KVConnectorFactory
and the model runner's connector order drive the connector (see vllm_harness.py for what is
real, compiled, stubbed or stood in). Each scenario asserts on vLLM's state (its own asserts
must not fire; statuses, freed blocks, self.requests emptied) and on bytes: the worker's
forward checks that every KV position it reads holds what the model wrote for that prefix.

Run: KVTIER_LIB_DIR=build/src VLLM_SRC=../shared/vllm python3 -m pytest \
        bindings/python/tests/test_vllm_scheduler.py"""
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import vllm_harness as H  # noqa: E402

H.skip_module_without_vllm("the tests in which vLLM's own scheduler judges kvtier.vllm")
import kvtier  # noqa: E402

BS = 16  # block_size


@pytest.fixture(scope="module", autouse=True)
def vllm():
    V = H.setup()
    yield V
    H.teardown()


@pytest.fixture
def make(tmp_path):
    """make(**extra, engine=dict(...)): an Engine with kvtier.vllm configured by
    kv_connector_extra_config (g2_blocks 64 and g3_path tmp_path unless given)."""
    with H.engines(tmp_path) as factory:
        yield factory


prompt = H.prompt


def finished_ids(e):
    """The request ids vLLM sent its workers as finished (SchedulerOutput.finished_req_ids)."""
    return set().union(*(so.finished_req_ids for _, so in e.scheduler_outputs))


def recving(e, rid):
    return sum(rid in (o.finished_recving or ()) for _, o in e.kv_outputs)


SCHED = pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
LOAD = pytest.mark.parametrize("load_async", [False, True], ids=["load_sync", "load_async"])


# 1, 2: a stored prefix served from kvtier, loaded synchronously or between steps

@SCHED
@LOAD
@pytest.mark.parametrize("gpu_miss,offload", [("reset", "eager"), ("evict", "eager"),
                                              ("evict", "lazy")])
def test_prefix_from_kvtier(make, async_scheduling, load_async, gpu_miss, offload):
    """A computes 70 tokens and kvtier stores its 4 full blocks. The GPU prefix cache then
    loses them (reset_prefix_cache, or evicted by C's blocks in a small pool; offload "lazy"
    stores them only then, as their G1 blocks are handed to C), so B, with A's
    first 64 tokens, gets them from kvtier: vLLM's prefix hit is external, its bytes are A's,
    and a sync load never puts B in WAITING_FOR_REMOTE_KVS (nor reports it in
    finished_recving: vLLM asserts that only finished requests get one then), an async load
    does, until its one finished_recving."""
    e = make(load_async=load_async, offload=offload, engine=dict(
        async_scheduling=async_scheduling, num_gpu_blocks=14 if gpu_miss == "evict" else 40))
    a = prompt(1, 70)
    e.add_request("A", a, max_tokens=3)
    e.run()
    if gpu_miss == "reset":
        assert e.sched.reset_prefix_cache()
    else:
        e.add_request("C", prompt(2, 200), max_tokens=2)  # all 13 usable blocks: evicts A's
        e.run()
    e.add_request("B", a[:64] + [5, 6, 7, 8, 9], max_tokens=3)
    e.run()
    assert e.hits["B"] == (0, 64), "B's prefix hits (GPU, kvtier): %s" % (e.hits["B"],)
    if load_async:
        assert e.status_log["B"][0] == "WAITING_FOR_REMOTE_KVS"
        assert recving(e, "B") == 1
    else:
        assert "WAITING_FOR_REMOTE_KVS" not in e.status_log["B"]
        assert recving(e, "B") == 0
    e.assert_outputs("A", "B")
    e.assert_drained()
    assert {"A", "B"} <= finished_ids(e)


@SCHED
@LOAD
@pytest.mark.parametrize("store_tier", ["G2", "G3"])
def test_cross_layer_blocks(make, async_scheduling, load_async, store_tier):
    """cross_layer_blocks: vLLM allocates one tensor of every layer, blocks outermost
    (KVConnectorModelRunnerMixin.allocate_uniform_kv_caches, FlashAttention's
    include_num_layers_dimension order) and hands it to register_cross_layers_kv_cache:
    one copy per block moves all layers. A's blocks, prompt and decode, are stored whole;
    B's hit reads A's bytes in every layer."""
    e = make(cross_layer_blocks=True, load_async=load_async, store_tier=store_tier,
             g3_blocks=64, engine=dict(async_scheduling=async_scheduling))
    assert e.worker.connector.prefer_cross_layer_blocks
    assert e.worker.connector._cross_layer_registered
    a = prompt(11, 70)
    e.add_request("A", a, max_tokens=30)
    e.run()
    assert e.sched.reset_prefix_cache()
    b = a + list(e.outputs["A"])[:26]  # 96 tokens: A's 6 blocks, decode's included
    e.add_request("B", b + [1, 2], max_tokens=3)
    e.run()
    assert e.hits["B"] == (0, 96), e.hits["B"]
    e.assert_outputs("A", "B")
    e.assert_drained()


@SCHED
def test_whole_prompt_from_kvtier(make, async_scheduling):
    """B's prompt is A's 64 tokens exactly: vLLM recomputes the last token (at most
    num_tokens - 1 tokens hit), so kvtier may serve 48 of them; an async load that served
    the whole prompt would be cut to num_tokens - 1 by _update_waiting_for_remote_kv."""
    e = make(engine=dict(async_scheduling=async_scheduling))
    a = prompt(3, 64)
    e.add_request("A", a, max_tokens=2)
    e.run()
    assert e.sched.reset_prefix_cache()
    e.add_request("B", list(a), max_tokens=2)
    e.run()
    assert e.hits["B"] == (0, 48)
    e.assert_outputs("A", "B")
    e.assert_drained()


# 3: decode steps (async scheduling's placeholders, speculative decoding's drafts)

@SCHED
@pytest.mark.parametrize("num_spec", [0, 2, 3], ids=["nospec", "spec2", "spec3"])
@pytest.mark.parametrize("offload", ["eager", "lazy"])
def test_decode_blocks_stored_once_known(make, async_scheduling, num_spec, offload):
    """A decodes 60 tokens after a 20-token prompt: with async scheduling the scheduled
    tokens run ahead of the known ones, with speculative decoding drafts (some rejected) are
    computed and overwritten. Only blocks whose tokens are final may be stored: B, with A's
    first 80 tokens (the prompt's first block, then generated ones), loads A's blocks from
    kvtier, and its forward reads them: byte for byte what the model writes for those
    tokens."""
    e = make(offload=offload, engine=dict(async_scheduling=async_scheduling,
                                          num_spec_tokens=num_spec, num_gpu_blocks=14))
    a = prompt(4, 20)
    e.add_request("A", a, max_tokens=60)
    e.run()
    e.assert_outputs("A")
    if num_spec:
        assert e.worker.drafts_rejected and e.worker.drafts_accepted
    if async_scheduling:
        assert e.ahead, "async scheduling never ran ahead of the known tokens"
    seq = a + e.outputs["A"]
    # F takes all 13 usable GPU blocks: A's cached blocks are evicted (and, offload "lazy",
    # stored then: their G1 blocks are handed to F to write)
    e.add_request("F", prompt(5, 200), max_tokens=2)
    e.run()
    e.add_request("B", seq[:80] + [11, 12], max_tokens=2)
    e.run()
    local, external = e.hits["B"]
    assert local == 0 and external % BS == 0
    assert external >= BS, "nothing of A reached kvtier"
    e.assert_outputs("B", "F")
    e.assert_drained()


@SCHED
@pytest.mark.parametrize("budget", [24, 40])
def test_chunked_prefill_stored(make, async_scheduling, budget):
    """A's 100-token prompt is prefilled in chunks of `budget` tokens (chunks end inside
    blocks): each block is stored once whole, and B reads them back right."""
    e = make(engine=dict(async_scheduling=async_scheduling, max_num_batched_tokens=budget))
    a = prompt(6, 100)
    e.add_request("A", a, max_tokens=3)
    e.run()
    assert sum("A" in so.num_scheduled_tokens for _, so in e.scheduler_outputs) > 3
    assert e.sched.reset_prefix_cache()
    e.add_request("B", a[:96] + [1, 2], max_tokens=3)
    e.run()
    assert e.hits["B"] == (0, 96)
    e.assert_outputs("A", "B")
    e.assert_drained()


# 4: preemption and resume

@SCHED
@LOAD
def test_preemption_and_resume(make, async_scheduling, load_async):
    """Three requests in a 16-block pool: vLLM preempts the last running one when a decode
    step needs a block, and resumes it later (kvtier may serve its stored blocks then). All
    finish with the model's tokens, and every byte read is right."""
    e = make(load_async=load_async, engine=dict(
        async_scheduling=async_scheduling, num_gpu_blocks=16, num_spec_tokens=0))
    for i, rid in enumerate("PQR"):
        e.add_request(rid, prompt(10 + i, 60), max_tokens=40)
    e.run()
    assert any("PREEMPTED" in log for log in e.status_log.values()), e.status_log
    e.assert_outputs("P", "Q", "R")
    e.assert_drained()
    assert set("PQR") <= finished_ids(e)


# 5: abort at every stage

def _loaded_engine(make, load_async, async_scheduling, **engine):
    """An engine whose kvtier holds A's 4 blocks (and whose GPU cache does not)."""
    e = make(load_async=load_async, engine=dict(async_scheduling=async_scheduling, **engine))
    a = prompt(20, 70)
    e.add_request("A", a, max_tokens=2)
    e.run()
    assert e.sched.reset_prefix_cache()
    return e, a


def _finish_and_check(e, rids, extra_prompt):
    """The engine steps until vLLM has nothing left; then D, with the same prefix, still
    reads right bytes; every request reached finished_req_ids."""
    e.run()
    e.add_request("D", extra_prompt, max_tokens=2)
    e.run()
    e.assert_outputs("D")
    e.assert_drained()
    missing = set(rids) - finished_ids(e)
    assert not missing, "never in SchedulerOutput.finished_req_ids: %s" % missing


@SCHED
def test_abort_before_match(make, async_scheduling):
    e, a = _loaded_engine(make, False, async_scheduling)
    e.add_request("B", a[:64] + [1, 2, 3], max_tokens=4)
    e.abort("B")  # before any schedule(): the connector never saw B
    _finish_and_check(e, "AB", a[:64] + [4, 5])


@SCHED
@LOAD
def test_abort_after_match_before_allocation(make, async_scheduling, load_async):
    """B is matched (get_num_new_matched_tokens) but allocate_slots fails for want of blocks,
    so it stays WAITING; aborted there."""
    e, a = _loaded_engine(make, load_async, async_scheduling, num_gpu_blocks=14,
                          max_num_batched_tokens=512)
    e.add_request("C", prompt(21, 180), max_tokens=20)  # 12 of the 13 usable blocks, then 13
    e.run(lambda e: e.requests["C"].num_computed_tokens > 0)
    e.add_request("B", a[:64] + [1, 2, 3], max_tokens=4)
    e.step()
    e.step()
    assert e.requests["B"].status.name == "WAITING", e.states()
    e.abort("B")
    _finish_and_check(e, "ABC", a[:64] + [4, 5])


@SCHED
def test_abort_during_sync_load(make, async_scheduling):
    """B's sync load runs in the step that schedules it; the abort arrives before that
    step's output is processed (EngineCore._process_aborts_queue)."""
    e, a = _loaded_engine(make, False, async_scheduling)
    e.add_request("B", a[:64] + [1, 2, 3], max_tokens=4)
    e.run_hook(lambda e: e.abort("B"))
    assert e.requests["B"].is_finished()
    _finish_and_check(e, "AB", a[:64] + [4, 5])


@SCHED
@pytest.mark.parametrize("when", ["load_running", "load_done"])
def test_abort_during_async_load(make, async_scheduling, when):
    """B waits in WAITING_FOR_REMOTE_KVS: aborted right after the step that started its load
    (finish_requests delays the free of its blocks until finished_recving), or after vLLM got
    its finished_recving but before it was promoted."""
    e, a = _loaded_engine(make, True, async_scheduling)
    e.add_request("B", a[:64] + [1, 2, 3], max_tokens=4)
    if when == "load_running":
        e.run_hook(lambda e: e.abort("B"))
    else:
        e.run(lambda e: "B" in e.sched.finished_recving_kv_req_ids)
        e.abort("B")
    assert e.requests["B"].is_finished()
    _finish_and_check(e, "AB", a[:64] + [4, 5])


@SCHED
@pytest.mark.parametrize("offload", ["eager", "lazy"])
def test_abort_during_store(make, async_scheduling, offload):
    """A is aborted in the step that computes (and stores) its blocks: if kvtier still reads
    them it returns delay_free, and vLLM keeps them until finished_sending."""
    e = make(offload=offload, engine=dict(async_scheduling=async_scheduling))
    a = prompt(22, 70)
    e.add_request("A", a, max_tokens=4)
    e.run_hook(lambda e: e.abort("A"))
    assert e.requests["A"].is_finished()
    e.run()
    assert e.sched.reset_prefix_cache()
    _finish_and_check(e, "A", a[:64] + [4, 5])


@SCHED
def test_abort_after_finish(make, async_scheduling):
    e, a = _loaded_engine(make, False, async_scheduling)
    assert e.abort("A") == []  # finished already: vLLM ignores it
    _finish_and_check(e, "A", a[:64] + [4, 5])


@SCHED
def test_abort_everything_midway(make, async_scheduling):
    """finish_requests(None, ...) at the worst moment: requests prefilling, decoding,
    waiting for an async load and waiting for blocks, all at once."""
    e, a = _loaded_engine(make, True, async_scheduling, num_gpu_blocks=24)
    e.add_request("B", a[:64] + [1, 2, 3], max_tokens=8)  # async load
    e.add_request("C", prompt(23, 100), max_tokens=30)
    e.add_request("E", prompt(24, 150), max_tokens=30)
    e.step()
    e.step()
    e.run_hook(lambda e: e.abort(*e.sched.requests))
    _finish_and_check(e, "ABCE", a[:64] + [4, 5])


# 6: reset_prefix_cache with running requests, and reset_connector

@SCHED
def test_reset_prefix_cache_with_running_requests(make, async_scheduling):
    """reset_prefix_cache(reset_running_requests=True) between steps preempts every running
    request (async scheduling discards the in-flight outputs) and must succeed; the next
    schedule() resumes them, and they finish with the model's tokens."""
    e = make(engine=dict(async_scheduling=async_scheduling))
    e.add_request("A", prompt(30, 40), max_tokens=30)
    e.add_request("B", prompt(31, 70), max_tokens=30)
    e.run(lambda e: len(e.outputs["A"]) >= 5)
    if async_scheduling:
        # With a batch in flight vLLM defers the free of its blocks (defer_block_free, for
        # a kv_both connector under async scheduling) and this reset would raise in vLLM
        # itself; the engine is paused (mode "keep": in-flight batches finish) first.
        e.pause()
    assert e.sched.reset_prefix_cache(reset_running_requests=True)
    assert e.sched.waiting and all(r.status.name == "PREEMPTED" for r in e.sched.waiting)
    e.resume()
    e.run()
    e.assert_outputs("A", "B")
    e.assert_drained()


@SCHED
def test_reset_connector_cache(make, vllm, async_scheduling):
    """reset_prefix_cache(reset_connector=True): afterwards nothing stored before the reset
    is served (vLLM calls the connector's reset_cache; None is taken as done)."""
    e = make(engine=dict(async_scheduling=async_scheduling))
    a = prompt(32, 70)
    e.add_request("A", a, max_tokens=2)
    e.run()
    stored = {h for ev in e.events() if isinstance(ev, vllm.kv_events.BlockStored)
              for h in ev.block_hashes}
    n = len(e.events())
    assert e.sched.reset_prefix_cache(reset_connector=True)
    e.add_request("B", a[:64] + [1, 2], max_tokens=2)
    e.run()
    assert e.hits["B"] == (0, 0), "served after the reset: %s" % (e.hits["B"],)
    # a subscriber learns that they are gone, as from vLLM's own reset (AllBlocksCleared)
    after = e.events()[n:]
    removed = {h for ev in after if isinstance(ev, vllm.kv_events.BlockRemoved)
               for h in ev.block_hashes}
    assert any(isinstance(ev, vllm.kv_events.AllBlocksCleared) for ev in after) or \
        stored <= removed, "the reset published no AllBlocksCleared / BlockRemoved"
    e.assert_drained()


# 7: a failed G3 load

def _corrupt_g3(path):
    """Flips a byte in every 4 KiB page of the G3 files under path: every slot's data or
    header (docs/G3_FORMAT.md) is then wrong."""
    n = 0
    for root, _, files in os.walk(path):
        for name in files:
            if not (name.startswith("kvtier-g3") and name.endswith(".bin")):
                continue
            with open(os.path.join(root, name), "r+b") as f:
                size = f.seek(0, os.SEEK_END)
                for off in range(0, size, 4096):
                    f.seek(off)
                    b = f.read(1)
                    f.seek(off)
                    f.write(bytes([b[0] ^ 0x5A]))
                    n += 1
                f.flush()
                os.fsync(f.fileno())
    return n


@SCHED
@LOAD
@pytest.mark.parametrize("fault", ["eio", "corrupt"])
def test_failed_g3_load_is_recomputed(make, tmp_path, async_scheduling, load_async, fault):
    """A stores to G3; B's load of it fails (an injected EIO, or the file's bytes corrupted on
    disk): kvtier reports the blocks in get_block_ids_with_load_errors, vLLM's
    KVConnectorOutput.invalid_block_ids makes it recompute them (kv_load_failure_policy
    "recompute"), B finishes with the model's tokens, and nothing it read was wrong except in
    the blocks reported."""
    manager = (dict(g3_fault_op=kvtier.G3_FAULT_READ, g3_fault_errno=5, g3_fault_count=1)
               if fault == "eio" else {})
    e = make(store_tier="G3", g2_blocks=0, g3_blocks=64, load_async=load_async,
             manager=manager, engine=dict(async_scheduling=async_scheduling))
    a = prompt(40, 70)
    e.add_request("A", a, max_tokens=2)
    e.run()
    assert e.sched.reset_prefix_cache()
    if fault == "corrupt":
        assert _corrupt_g3(str(tmp_path)) >= 8
    e.add_request("B", a[:64] + [1, 2, 3], max_tokens=3)
    e.run()
    assert e.hits["B"][1] == 64
    bad = set().union(*(o.invalid_block_ids for _, o in e.kv_outputs))
    assert bad, "no load error reported"
    if async_scheduling and not load_async:
        # vLLM itself: the failed step's token is discarded, but the batch already in flight
        # (scheduled on top of it) is processed as usual, so B's text is not checked here.
        e.assert_outputs("A")
    else:
        e.assert_outputs("A", "B")
    e.assert_drained()


def test_persistent_g3_restart_is_safe(make, tmp_path):
    """manager g3_persist: G3 is <g3_path>/kvtier-g3.bin, kept when vLLM stops. vLLM builds
    a scheduler connector and a worker connector (two processes, one g3_path): only the
    worker's manager opens the persistent file, so both start, again after a restart. The
    scheduler's registry of G3 starts empty after the restart (docs/VLLM.md, limits): B is
    computed, never served a wrong block."""
    extra = dict(store_tier="G3", g2_blocks=0, g3_blocks=64, manager=dict(g3_persist=1))
    e = make(**extra)
    a = prompt(41, 70)
    e.add_request("A", a, max_tokens=2)
    e.run()
    e.assert_drained()
    e.close()
    assert (tmp_path / "kvtier-g3.bin").exists() or any(tmp_path.rglob("kvtier-g3.bin"))
    e = make(**extra)
    e.add_request("B", a[:64] + [1, 2, 3], max_tokens=2)
    e.run()
    e.assert_outputs("B")
    e.assert_drained()


# 8: tenants

@SCHED
def test_tenants_do_not_share_blocks(make, async_scheduling):
    """The same tokens under another cache_salt, or another LoRA, must not be served from
    what a tenant stored (vLLM's own block hashes differ); the same tenant's are."""
    e = make(engine=dict(async_scheduling=async_scheduling))
    a = prompt(50, 70)
    e.add_request("A", a, max_tokens=2, cache_salt="tenant-1")
    e.run()
    assert e.sched.reset_prefix_cache()
    e.add_request("B", a[:64] + [1, 2], max_tokens=2, cache_salt="tenant-2")
    e.add_request("L", a[:64] + [1, 2], max_tokens=2, cache_salt="tenant-1", lora="adapter")
    e.run()
    assert e.sched.reset_prefix_cache()
    e.add_request("C", a[:64] + [3, 4], max_tokens=2, cache_salt="tenant-1")
    e.run()
    assert e.hits["B"] == (0, 0), "tenant-2 served tenant-1's blocks: %s" % (e.hits["B"],)
    assert e.hits["L"] == (0, 0), "a LoRA request served base-model blocks"
    assert e.hits["C"] == (0, 64)
    e.assert_drained()


# 9: KV events

@pytest.mark.parametrize("tier", ["G2", "G3"])
def test_events_are_vllms(make, vllm, tier):
    """What vLLM's scheduler publishes from the connector's take_events: vLLM's BlockStored
    with vLLM's own block hashes (as its GPU events convert them: maybe_convert_block_hash),
    chained parents, the block's tokens, block_size, the LoRA name, the medium ("CPU" for G2,
    "FS" for G3); BlockRemoved with a hash vLLM stored before."""
    extra = dict(store_tier=tier)
    if tier == "G3":
        extra.update(g2_blocks=0, g3_blocks=64)
    else:
        extra.update(g2_blocks=6)  # small: the second request evicts
    e = make(**extra, engine=dict(async_scheduling=True))
    a, b = prompt(60, 70), prompt(61, 70)
    e.add_request("A", a, max_tokens=2)
    e.run()
    e.add_request("B", b, max_tokens=2)
    e.run()
    e.add_request("L", a, max_tokens=2, cache_salt="tenant", lora="adapter")
    e.run()
    conv = vllm.kv_cache_utils.maybe_convert_block_hash
    want = {}  # vLLM's hash -> (parent, tokens, LoRA name)
    for rid in "ABL":
        r = e.requests[rid]
        toks = list(r.all_token_ids)
        lora = r.lora_request.lora_name if r.lora_request else None
        for i, h in enumerate(r.block_hashes):
            want[conv(h)] = (conv(r.block_hashes[i - 1]) if i else None,
                             toks[i * BS:(i + 1) * BS], lora)
    events = e.events()
    stored = [ev for ev in events if isinstance(ev, vllm.kv_events.BlockStored)]
    assert stored, "no BlockStored published"
    medium = {"G2": "CPU", "G3": "FS"}[tier]
    seen = set()
    for ev in events:
        assert isinstance(ev, (vllm.kv_events.BlockStored, vllm.kv_events.BlockRemoved))
        assert ev.medium == medium, ev
        if isinstance(ev, vllm.kv_events.BlockStored):
            assert ev.block_size == BS
            parent = ev.parent_block_hash
            for h in ev.block_hashes:
                assert h in want, "BlockStored hash %r is none of vLLM's" % (h,)
                assert want[h][0] == parent, "parent of %r" % (h,)
                assert ev.lora_name == want[h][2]
                parent = h
                seen.add(h)
            assert ev.token_ids == [t for h in ev.block_hashes for t in want[h][1]]
        else:
            assert all(h in seen for h in ev.block_hashes)
    for rid, toks in (("A", a), ("B", b)):
        full = {conv(h) for h in e.requests[rid].block_hashes[:len(toks) // BS]}
        assert full <= seen, "%s: %d of its %d prompt blocks have no BlockStored" % (
            rid, len(full - seen), len(full))
    if tier == "G2":
        assert any(isinstance(ev, vllm.kv_events.BlockRemoved) for ev in events)
    e.assert_drained()


# 10: bad kv_connector_extra_config

@pytest.mark.parametrize("bad,key", [
    (dict(store_tier="G4"), "store_tier"), (dict(offload="sometimes"), "offload"),
    (dict(g2_block=5), "g2_block"), (dict(g2_blocks=-1), "g2_blocks"),
    (dict(g2_blocks="many"), "g2_blocks"), (dict(g3_blocks=1.5), "g3_blocks"),
    (dict(load_async="no"), "load_async"), (dict(lazy_offload="yes"), "lazy_offload"),
    (dict(manager="g3_io"), "manager"),
    (dict(manager=dict(no_such_field=1)), "no_such_field"),
    (dict(store_tier="G3", g3_blocks=0), "g3_blocks")])
@pytest.mark.parametrize("role", ["SCHEDULER", "WORKER"])
def test_bad_extra_config(vllm, tmp_path, bad, key, role):
    """vLLM's factory builds the connector; a bad value is a ValueError naming its key."""
    extra = dict(g2_blocks=8, g3_path=str(tmp_path))
    extra.update(bad)
    cfg = H.make_vllm_config(extra, async_scheduling=True, block_size=BS, num_gpu_blocks=8,
                             max_model_len=256, max_num_batched_tokens=64, max_num_seqs=2,
                             num_spec_tokens=0, kv_events=False,
                             kv_load_failure_policy="recompute")
    kci = vllm.kv_cache_interface
    spec = kci.FullAttentionSpec(block_size=BS, num_kv_heads=2, head_size=8,
                                 dtype=sys.modules["torch"].float16)
    kcc = kci.KVCacheConfig(num_blocks=8, kv_cache_tensors=[kci.KVCacheTensor(
        size=spec.page_size_bytes * 8, shared_by=["l0"])],
        kv_cache_groups=[kci.KVCacheGroupSpec(["l0"], spec)])
    with pytest.raises(ValueError, match=key):
        c = vllm.KVConnectorFactory.create_connector(
            config=cfg, role=getattr(vllm.base.KVConnectorRole, role), kv_cache_config=kcc)
        try:
            if role == "WORKER":
                c.register_kv_caches(H.allocate_kv_caches(kcc, ["l0"]))
        finally:
            c.shutdown()


def _parallel_config(**parallel):
    return H.make_vllm_config(dict(g2_blocks=8, num_gpu_blocks=8), async_scheduling=True,
                              block_size=BS, num_gpu_blocks=8, max_model_len=256,
                              max_num_batched_tokens=64, max_num_seqs=2, num_spec_tokens=0,
                              kv_events=False,
                              kv_load_failure_policy="recompute", **parallel)


@pytest.mark.parametrize("field", ["decode_context_parallel_size",
                                   "prefill_context_parallel_size"])
@pytest.mark.parametrize("role", ["SCHEDULER", "WORKER"])
def test_context_parallel_is_refused(vllm, field, role):
    """DCP/PCP > 1 split a block's tokens across ranks: refused, naming the field."""
    cfg = _parallel_config(tensor_parallel_size=2, **{field: 2})
    with pytest.raises(ValueError, match=field):
        vllm.KVConnectorFactory.create_connector(
            config=cfg, role=getattr(vllm.base.KVConnectorRole, role), kv_cache_config=None)


def test_world_size_2_is_accepted(vllm, tmp_path):
    """TP 2: a scheduler connector of world_size 2, and workers of each rank; a rank outside
    the world is refused. (A worker's G3 directory and namespaces per rank, and the
    scheduler counting both ranks' reports: test_vllm_parallel.py.)"""
    cfg = _parallel_config(tensor_parallel_size=2)
    assert cfg.parallel_config.world_size == 2
    c = vllm.KVConnectorFactory.create_connector(
        config=cfg, role=vllm.base.KVConnectorRole.SCHEDULER, kv_cache_config=None)
    try:
        assert c.connector is not None
    finally:
        c.shutdown()
    for rank in (0, 1):
        cfg = _parallel_config(tensor_parallel_size=2, rank=rank)
        c = vllm.KVConnectorFactory.create_connector(
            config=cfg, role=vllm.base.KVConnectorRole.WORKER, kv_cache_config=None)
        c.shutdown()
    cfg = _parallel_config(tensor_parallel_size=2, rank=2)
    with pytest.raises(ValueError, match="rank"):
        vllm.KVConnectorFactory.create_connector(
            config=cfg, role=vllm.base.KVConnectorRole.WORKER, kv_cache_config=None)


@pytest.mark.parametrize("role", ["SCHEDULER", "WORKER"])
def test_external_launcher_with_world_size_2_is_refused(vllm, role):
    """Under 'external_launcher' each process schedules for itself over one worker: nothing
    would count a second rank's reports, so it is refused by name; with world 1 it runs."""
    cfg = _parallel_config(tensor_parallel_size=2)
    cfg.parallel_config.distributed_executor_backend = "external_launcher"
    with pytest.raises(ValueError, match="external_launcher"):
        vllm.KVConnectorFactory.create_connector(
            config=cfg, role=getattr(vllm.base.KVConnectorRole, role), kv_cache_config=None)
    cfg = _parallel_config()
    cfg.parallel_config.distributed_executor_backend = "external_launcher"
    vllm.KVConnectorFactory.create_connector(
        config=cfg, role=getattr(vllm.base.KVConnectorRole, role),
        kv_cache_config=None).shutdown()


# a mixed workload: arrivals, shared prefixes, preemptions, drafts, aborts, G2 evictions

@pytest.mark.parametrize("seed", range(8))
def test_mixed_workload(make, seed):
    mixed_workload(make, seed)


def mixed_workload(make, seed):
    """Requests arrive over time with prefixes shared three ways, in a GPU pool small
    enough to preempt and a G2 small enough to evict; some are aborted mid-way. vLLM's
    asserts hold throughout, every request that ran to its end generated the model's
    tokens, every byte read is right, and vLLM ends with nothing left."""
    import random
    rnd = random.Random(seed)
    e = make(g2_blocks=rnd.choice([12, 24, 64]), load_async=rnd.random() < 0.5,
             offload=rnd.choice(["eager", "lazy"]),
             engine=dict(async_scheduling=seed % 2 == 0, num_gpu_blocks=rnd.choice([18, 24]),
                         num_spec_tokens=rnd.choice([0, 2, 3]),
                         max_num_batched_tokens=rnd.choice([40, 96, 256]), max_num_seqs=4))
    bases = [prompt(100 + seed * 3 + i, 96) for i in range(3)]
    plan = {}  # step -> actions
    for i in range(16):
        base = rnd.choice(bases)
        toks = base[:rnd.choice([16, 40, 64, 96])] + prompt(200 + seed * 20 + i,
                                                             rnd.randrange(1, 30))
        plan.setdefault(rnd.randrange(0, 120), []).append(
            ("add", "R%d" % i, toks, rnd.randrange(4, 48)))
        if rnd.random() < 0.2:
            plan.setdefault(rnd.randrange(1, 160), []).append(("abort", "R%d" % i))
    last = max(plan)
    for _ in range(20000):
        for action in plan.pop(e.steps, ()):
            if action[0] == "add":
                e.add_request(action[1], action[2], max_tokens=action[3])
            elif action[1] in e.requests:
                e.abort(action[1])
        if e.steps > last and not e.has_work():
            break
        e.step()  # idle steps too: time passes until the next arrival
    else:
        raise AssertionError("workload did not finish: %s" % e.states())
    done = [r for r in e.requests if r not in e.aborted]
    e.assert_outputs(*done)
    for r in done:
        assert len(e.outputs[r]) == e.requests[r].max_tokens
    e.assert_drained()
    assert set(e.requests) <= finished_ids(e)
    return e
