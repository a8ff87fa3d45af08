#!/usr/bin/python3
"""kvtier's prefix cache against vLLM's own, on the shipped trace (issue 25's first row):

- kvtier: `kvtier-replay --g2-blocks 0 --g3-blocks 0` (G1 only, 512-token blocks, tiny block
  memory), its own `seconds` for the whole loop (hash, match, alloc, register, release), and
  its G1 hits;
- vLLM: its KVCacheManager, FullAttentionManager, KVCacheBlock and FreeKVCacheBlockQueue
  compiled from VLLM_SRC, over the test harness's BlockPool stand-in
  (bindings/python/tests/vllm_harness.py: block_pool.py is not in VLLM_SRC), driven with the
  same requests, capacity and block size: per request a vLLM Request (which hashes its
  blocks with the configured hash function), the prefix-cache lookup, allocate_slots (which
  caches the new full blocks) and free. Timed: that loop, not the trace's parsing.

One rule differs, and the vLLM side follows kvtier's so that the hits can be compared: vLLM's
get_computed_blocks caps a hit at the prompt's length minus one token (the last must be
recomputed for its logits); kvtier-replay counts a whole-prompt hit. So the lookup is the
coordinator's find_longest_cache_hit up to the whole prompt, and a whole-prompt hit takes
its blocks (allocate_new_computed_blocks, as allocate_slots would) without allocating.

usage: VLLM_SRC=../shared/vllm KVTIER_LIB_DIR=build/src bench/vllm_prefix_cache.py
           [--build build] [--runs 3] [--requests N] [--g1-blocks 4000] [--hash sha256 ...]
Prints a markdown table: per hash function, vLLM's time per block against kvtier's in the
same run, their ratio, and whether the hits are identical."""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bindings", "python", "tests"))
BS = 512  # the trace's block size


def requests(path, limit):
    out = []
    with open(path) as f:
        for line in f:
            if line.strip():
                out.append(json.loads(line)["hash_ids"])
                if limit and len(out) == limit:
                    break
    return out


def vllm_run(V, h, trace, capacity, hash_name):
    """Seconds for the loop and the blocks served from the cache."""
    hash_fn = V.hashing.get_hash_fn_by_name(hash_name)
    V.kv_cache_utils.init_none_hash(hash_fn)
    kci = V.kv_cache_interface
    spec = kci.FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=1, dtype="float16")
    # vLLM's block 0 is its null block: one more than kvtier's capacity.
    config = kci.KVCacheConfig(num_blocks=capacity + 1, kv_cache_tensors=[],
                               kv_cache_groups=[kci.KVCacheGroupSpec(["layer.0"], spec)])
    longest = max(len(ids) for ids in trace) * BS
    mgr = V.KVCacheManager(config, max_model_len=longest, scheduler_block_size=BS,
                           hash_block_size=BS)
    hasher = V.kv_cache_utils.get_request_block_hasher(BS, hash_fn)
    params = h.SamplingParams(max_tokens=1)
    prompts = [[i * BS + j for i in ids for j in range(BS)] for ids in trace]
    hits = 0
    t0 = time.perf_counter()
    for k, tokens in enumerate(prompts):
        req = V.Request(request_id=str(k), prompt_token_ids=tokens, sampling_params=params,
                        pooling_params=None, block_hasher=hasher)
        blocks, hit_tokens = mgr.coordinator.find_longest_cache_hit(req.block_hashes,
                                                                    req.num_tokens)[:2]
        hits += hit_tokens // BS
        if hit_tokens < req.num_tokens:
            got = mgr.allocate_slots(req, req.num_tokens - hit_tokens, hit_tokens,
                                     mgr.create_kv_cache_blocks(blocks))
            if got is None:
                raise SystemExit("vLLM: request %d does not fit %d blocks" % (k, capacity))
        else:
            mgr.coordinator.allocate_new_computed_blocks(req.request_id, blocks, hit_tokens, 0)
        req.num_computed_tokens = req.num_tokens
        mgr.free(req)
    return time.perf_counter() - t0, hits


def kvtier_run(build, trace_path, capacity):
    out = subprocess.run([os.path.join(build, "bin", "kvtier-replay"), "--trace", trace_path,
                          "--g1-blocks", str(capacity), "--g2-blocks", "0", "--g3-blocks", "0",
                          "--chunk-bytes", "64", "--no-progress", "--json"],
                         check=True, capture_output=True, text=True).stdout
    r = json.loads(out)
    return r["seconds"], r["g1_hit_blocks"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--trace", default=os.path.join(ROOT, "examples", "traces",
                                                    "conversation_trace.jsonl"))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--requests", type=int, default=0, help="the first N (0: all)")
    ap.add_argument("--g1-blocks", type=int, default=4000)
    ap.add_argument("--hash", nargs="+", default=["sha256", "xxhash"],
                    help="vLLM's prefix_caching_hash_algo values to run (sha256 is its default)")
    a = ap.parse_args()
    if not os.environ.get("VLLM_SRC"):
        raise SystemExit("set VLLM_SRC to vLLM's source (e.g. ../shared/vllm)")
    import vllm_harness as h
    V = h.setup()
    trace = requests(a.trace, a.requests)
    blocks = sum(len(ids) for ids in trace)
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl") as f:
        with open(a.trace) as src:
            for k, line in enumerate(l for l in src if l.strip()):
                if a.requests and k == a.requests:
                    break
                f.write(line)
        f.flush()
        theirs = {name: [] for name in a.hash}
        ours = []
        for _ in range(a.runs):  # alternated, so that drift falls on both
            ours.append(kvtier_run(a.build, f.name, a.g1_blocks))
            for name in a.hash:
                theirs[name].append(vllm_run(V, h, trace, a.g1_blocks, name))
    kv_s = statistics.median(s for s, _ in ours)
    print("%d requests, %d blocks of %d tokens, capacity %d blocks, %d runs each\n"
          % (len(trace), blocks, BS, a.g1_blocks, a.runs))
    print("| vLLM hash | vLLM: per block (runs) | kvtier-replay: per block (runs) | ratio | "
          "hit blocks: vLLM, kvtier | goal |")
    print("|---|---|---|---:|---|---|")
    for name, runs in theirs.items():
        v_s = statistics.median(s for s, _ in runs)
        hits_v = {hh for _, hh in runs}
        hits_k = {hh for _, hh in ours}
        print("| %s | %.2f us (%s) | %.0f ns (%s) | %.1fx | %s, %s: %s | >= 50x, hits identical |"
              % (name, v_s / blocks * 1e6, ", ".join("%.2f" % (s / blocks * 1e6) for s, _ in runs),
                 kv_s / blocks * 1e9, ", ".join("%.0f" % (s / blocks * 1e9) for s, _ in ours),
                 v_s / kv_s, "/".join(map(str, sorted(hits_v))),
                 "/".join(map(str, sorted(hits_k))),
                 "identical" if hits_v == hits_k and len(hits_v) == 1 else "DIFFERENT"))


if __name__ == "__main__":
    main()
