#!/usr/bin/python3
"""Turns bench_transfer's JSON into the transfer table of docs/BENCHMARKS.md: medians and
each figure's ratio to the baseline measured in the same run."""
import json
import sys

data = json.load(open(sys.argv[1]))
med = {b["run_name"]: b for b in data["benchmarks"] if b.get("aggregate_name") == "median"}


def gbps(name):
    return med[name]["bytes_per_second"] / 1e9


rows = []
for run, label, base, target in (
        ("BM_OffloadG1toG2/65536/0/32/64/manual_time", "G1 stand-in -> G2, 32 x 2 x 64 KiB chunks (4 MiB blocks), batch 64",
         "BM_Baseline_Memcpy/65536/64", ">= 0.9x"),
        ("BM_OffloadG1toG2/8192/0/32/64/manual_time", "the same with 32 x 2 x 8 KiB chunks, G1 stand-in (contiguous blocks)",
         "BM_Baseline_Memcpy/8192/64", ">= 0.7x"),
        ("BM_OffloadG1toG2/8192/1/32/64/manual_time", "the same, G1 an engine layout (64 scattered 8 KiB chunks per block)",
         "BM_Baseline_Memcpy/8192/64", ">= 0.7x"),
        ("BM_OffloadG1toG2/16384/0/1/1024/manual_time", "G1 stand-in -> G2, replay geometry: 1024 blocks of 1 x 2 x 16 KiB",
         "BM_Baseline_Memcpy/512/1024", ">= 0.7x"),
        ("BM_OffloadG1toG3/32/65536/64/manual_time", "G1 -> G3 write, 4 MiB blocks, batch 64 (O_DIRECT, io_uring)",
         "BM_Baseline_Dd/1/4096/64/manual_time", ">= 0.8x"),
        ("BM_OnboardG3toG1/32/65536/64/manual_time", "G3 -> G1 read (checksum verified), 4 MiB blocks, batch 64",
         "BM_Baseline_Dd/0/4096/64/manual_time", ">= 0.8x"),
        ("BM_OffloadG1toG3/1/16384/1024/manual_time", "G1 -> G3 write, replay geometry: 1024 blocks of 32 KiB",
         "BM_Baseline_Dd/1/32/1024/manual_time", ">= 0.8x"),
        ("BM_OnboardG3toG1/1/16384/1024/manual_time", "G3 -> G1 read, replay geometry: 1024 blocks of 32 KiB",
         "BM_Baseline_Dd/0/32/1024/manual_time", ">= 0.8x")):
    k, b = gbps(run), gbps(base)
    if "Memcpy" in base:
        what = "plain memcpy"
    else:
        bs = base.split("/")[2]
        bs = "4M" if bs == "4096" else bs + "K"
        what = "dd bs=%s %s=direct" % (bs, "oflag" if "Dd/1/" in base else "iflag")
    rows.append((label, "%.2f GB/s" % k, "%s: %.2f GB/s" % (what, b), "%.2fx" % (k / b), target))
pc = med["BM_PipelinePerContainer"]
direct = med["BM_Baseline_DirectBookkeeping"]
per = 1e6 / pc["items_per_second"]
per_direct = 1e6 / direct["items_per_second"]
rows.append(("pipeline overhead per container (1-block containers of 0-byte blocks, batch 64)",
             "%.2f us" % per, "same bookkeeping called directly: %.2f us" % per_direct,
             "%.1fx" % (per / per_direct), "<= 20 us"))
cl = med["BM_CancelLatency/iterations:2000"]
rows.append(("cancel -> XFER_DONE(CANCELLED) seen by kvt_manager_poll, container waiting on a fence",
             "p50 %.1f us, p99 %.1f us" % (cl["p50_us"], cl["p99_us"]),
             "a sweep every sweep_interval would wait up to %.0f us" % cl["sweep_interval_us"],
             "%.4fx" % (cl["p99_us"] / cl["sweep_interval_us"]), "p99 <= 1 ms"))
print("| measurement | kvtier (median of 5) | baseline, same run | ratio | target |")
print("|---|---|---|---|---|")
for r in rows:
    print("| %s |" % " | ".join(r))
