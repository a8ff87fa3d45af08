#!/usr/bin/python3
"""Turns bench_core's JSON into the table of docs/BENCHMARKS.md: medians, per-block
figures, and each figure's ratio to the baseline measured in the same run."""
import json
import sys

data = json.load(open(sys.argv[1]))
med = {b["run_name"]: b for b in data["benchmarks"] if b.get("aggregate_name") == "median"}


def ns_per_item(name):
    b = med[name]
    return 1e9 / b["items_per_second"]


def gbps(name):
    return med[name]["bytes_per_second"] / 1e9


rows = []
h16, x16 = ns_per_item("BM_HashSequence/16"), ns_per_item("BM_Baseline_XXH3/16")
rows.append(("`kvt_hash_tokens`, 16-token blocks", "%.1f ns/block" % h16,
             "XXH3_64bits per block: %.1f ns" % x16, "%.2fx" % (h16 / x16), "<= 40 ns/block"))
g512, x512 = gbps("BM_HashSequence/512"), gbps("BM_Baseline_XXH3/512")
rows.append(("`kvt_hash_tokens`, 512-token blocks", "%.1f GB/s" % g512,
             "XXH3_64bits: %.1f GB/s" % x512, "%.2fx the time" % (x512 / g512),
             ">= 10 GB/s or <= 1.3x"))
naive = ns_per_item("BM_Baseline_NaiveAllocRegisterRelease")
for name, label in (("BM_AllocRegisterRelease", "alloc + `kvt_block_register_hash` + release"),
                    ("BM_AllocRegisterBatchRelease", "alloc + `kvt_block_register_hashes` + release")):
    v = ns_per_item(name)
    rows.append((label + ", no dedup", "%.1f ns/block" % v,
                 "naive unordered_map + std::list LRU: %.1f ns" % naive, "%.2fx" % (v / naive),
                 "<= 150 ns/block"))
for kind in ("Hot", "Cold"):
    small = ns_per_item("BM_MatchPrefix64_%s/10000" % kind)
    big = ns_per_item("BM_MatchPrefix64_%s/1000000" % kind)
    base = ns_per_item("BM_Baseline_NaiveMatch64/1000000")
    rows.append(("`kvt_tier_match_prefix`, 64 blocks, %s, 10^4 blocks" % kind.lower(),
                 "%.1f ns/block" % small, "naive unordered_map: %.1f ns" % base,
                 "%.2fx" % (small / base), "<= 40 ns/block"))
    rows.append(("`kvt_tier_match_prefix`, 64 blocks, %s, 10^6 blocks" % kind.lower(),
                 "%.1f ns/block" % big, "the same at 10^4: %.1f ns" % small,
                 "%.2fx" % (big / small), "within 1.5x of 10^4"))
r_small = ns_per_item("BM_Baseline_TableThenSlot64/10000")
r_big = ns_per_item("BM_Baseline_TableThenSlot64/1000000")
rows.append(("memory floor: a random table entry, then its slot, 10^6 blocks",
             "%.1f ns/block" % r_big, "the same at 10^4: %.1f ns" % r_small,
             "%.2fx" % (r_big / r_small), "-"))
for n in ("10000", "1000000"):
    mb = med["BM_MatchPrefix64_Hot/%s" % n]["metadata_B_per_block"]
    rows.append(("metadata per block, 10^%d blocks" % len(n[1:]), "%.1f B" % mb, "-", "-",
                 "<= 64 B"))

print("| operation | kvtier (median of 5) | baseline, same run | ratio | target |")
print("|---|---|---|---|---|")
for r in rows:
    print("| %s |" % " | ".join(r))
ctx = data["context"]
print("\n%s, %d CPUs at %.0f MHz, %s build of google-benchmark" % (
    ctx["date"], ctx["num_cpus"], ctx["mhz_per_cpu"], ctx["library_build_type"]))
