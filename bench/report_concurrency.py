#!/usr/bin/python3
"""Turns bench_concurrency's JSON into the scaling table of docs/BENCHMARKS.md: for 1, 2 and
4 transfers in flight, kvtier's median beside the same bytes copied by as many plain workers
in the same run, and each one's scaling over its own single-transfer figure."""
import json
import sys

data = json.load(open(sys.argv[1]))
med = {b["run_name"]: b for b in data["benchmarks"] if b.get("aggregate_name") == "median"}


def gbps(name):
    return med[name + "/manual_time"]["bytes_per_second"] / 1e9


print("| direction | transfers in flight | kvtier (median of %d) | baseline, same run | ratio | "
      "kvtier scaling | baseline scaling |" % med[next(iter(med))]["repetitions"])
print("|---|---|---|---|---|---|---|")
for direction, run, base, what in (
        ("G1 -> G2", "BM_ConcurrentG1toG2", "BM_Baseline_MemcpyThreads", "memcpy thread"),
        ("G2 -> G3", "BM_ConcurrentG2toG3", "BM_Baseline_DdConcurrent", "dd oflag=direct")):
    k1, b1 = gbps(run + "/1"), gbps(base + "/1")
    for k in (1, 2, 4):
        v, b = gbps("%s/%d" % (run, k)), gbps("%s/%d" % (base, k))
        print("| %s | %d | %.2f GB/s | %d x %s: %.2f GB/s | %.2fx | %.2fx | %.2fx |"
              % (direction, k, v, k, what, b, v / b, v / k1, b / b1))
