#!/usr/bin/python3
"""Turns bench_connector's JSON into the table of docs/BENCHMARKS.md: per request step, the
connector's three scheduler calls against the bare block calls they make, the overhead, and
issue 12's goal for it (2 us + 50 ns per block)."""
import json
import sys

data = json.load(open(sys.argv[1]))
# Each repetition's median iteration (p50_ns), then the median of the repetitions: the
# machine is shared, and a preempted iteration moves a mean, not a median.
med = {b["run_name"]: b["p50_ns"] for b in data["benchmarks"]
       if b.get("aggregate_name") == "median"}


def t(name, n):
    return med["%s/%d/iterations:4000/manual_time" % (name, n)]


print("| request step, N blocks | connector (median step, median of 5) | bare block calls, same run | "
      "overhead | goal: 2 us + 50 ns/block | ratio to goal |")
print("|---|---|---|---|---|---|")
for kind, what in (("Miss", "N new blocks, N stores planned"),
                   ("Hit", "N blocks in G2, N loads planned")):
    for n in (1, 16, 256):
        c, b = t("BM_ConnectorStep_" + kind, n), t("BM_Baseline_BlockCalls_" + kind, n)
        goal = 2000 + 50 * n
        print("| %s, N = %d | %.2f us | %.2f us | %.2f us (%.0f ns/block) | %.2f us | %.2fx |"
              % (what, n, c / 1e3, b / 1e3, (c - b) / 1e3, (c - b) / n, goal / 1e3,
                 (c - b) / goal))
ctx = data["context"]
print("\n%s, %d CPUs at %.0f MHz" % (ctx["date"], ctx["num_cpus"], ctx["mhz_per_cpu"]))
