#!/usr/bin/python3
"""The observe stream's cost to the connector step, from bench_connector's ObservedPair
benchmarks run against two builds alternately (bench/observe_ab.sh). Each run gives, per step
and reader, the median of 5 repetitions of: the reader's step and the same step with nobody
reading taken in turns, and their ratio. Tabled: the median of the runs, and their spread.

usage: report_observed.py DIR   (DIR holds before1.json.. and after1.json..)"""
import glob
import json
import statistics
import sys

MODES = {0: ("nobody (the control)", "1.00x"), 1: ("one subscriber", "<= 1.10x"),
         2: ("event log", "<= 1.15x"),
         3: ("endpoint, no client", "<= 1.01x")}


def runs(d, build):
    out = []
    for path in sorted(glob.glob("%s/%s*.json" % (d, build))):
        data = json.load(open(path))
        out.append({b["run_name"]: b for b in data["benchmarks"]
                    if b.get("aggregate_name") == "median"})
    return out


def cell(rs, kind, n, mode):
    name = "BM_ObservedPair_%s/%d/%d/iterations:4000/manual_time" % (kind, n, mode)
    ratio = [r[name]["ratio"] for r in rs]
    plain = statistics.median(r[name]["plain_ns"] for r in rs) / 1e3
    watched = statistics.median(r[name]["p50_ns"] for r in rs) / 1e3
    return "%.2f / %.2f us | %.3fx (%.3f-%.3f)" % (watched, plain, statistics.median(ratio),
                                                  min(ratio), max(ratio))


d = sys.argv[1]
before, after = runs(d, "before"), runs(d, "after")
print("%d and %d runs\n" % (len(before), len(after)))
print("| step | reader | before: step / nobody | ratio (runs) | after: step / nobody | "
      "ratio (runs) | goal |")
print("|---|---|---:|---:|---:|---:|---|")
for kind in ("Miss", "Hit"):
    for n in (16, 256):
        for mode, (name, goal) in MODES.items():
            print("| %s, N = %d | %s | %s | %s | %s |"
                  % (kind, n, name, cell(before, kind, n, mode), cell(after, kind, n, mode), goal))
