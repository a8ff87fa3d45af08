#!/usr/bin/env bash
# kvtier-replay against baselines measured in the same run (docs/BENCHMARKS.md):
#   - G1 only, whole Mooncake trace, tiny blocks (5 runs) vs tools/replay/oracle.py, a naive
#     Python loop over the same rule that neither hashes nor touches memory (5 runs);
#   - three tiers, the default (3 runs): each direction's bandwidth vs the engine benchmark
#     at the replay's geometry (bench_transfer, 3 repetitions); and G1 -> G2 again with
#     --no-prefault (3 runs), where the copies into G2 fault its pages in.
#   bench/replay.sh [build dir, default build]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
trace=examples/traces/conversation_trace.jsonl
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for i in 1 2 3 4 5; do
  "$build/bin/kvtier-replay" --trace $trace --g2-blocks 0 --g3-blocks 0 --chunk-bytes 64 \
    --json > "$out/g1-$i.json"
  /usr/bin/python3 - "$out/oracle-$i" <<'PY'
import subprocess, sys, time
t = time.perf_counter()
subprocess.run(["/usr/bin/python3", "tools/replay/oracle.py",
                "examples/traces/conversation_trace.jsonl", "4000"], check=True,
               stdout=subprocess.DEVNULL)
open(sys.argv[1], "w").write(str(time.perf_counter() - t))
PY
done
for i in 1 2 3; do
  "$build/bin/kvtier-replay" --trace $trace --json > "$out/tiers-$i.json"
  "$build/bin/kvtier-replay" --trace $trace --json --no-prefault > "$out/cold-$i.json"
done
"$build/bench/bench_transfer" --benchmark_filter='(OffloadG1toG2|OffloadG1toG3|OnboardG3toG1|Baseline_Memcpy)/.*1024' \
  --benchmark_repetitions=3 --benchmark_report_aggregates_only=true --benchmark_format=json \
  > "$out/engine.json" 2>/dev/null
/usr/bin/python3 - "$out" <<'PY'
import glob, json, os, statistics, sys
d = sys.argv[1]
load = lambda pat: [json.load(open(f)) for f in sorted(glob.glob(os.path.join(d, pat)))]
g1 = statistics.median(r["seconds"] for r in load("g1-*.json"))
oracle = statistics.median(float(open(f).read()) for f in glob.glob(os.path.join(d, "oracle-*")))
tiers = load("tiers-*.json")
engine = {b["run_name"]: b["bytes_per_second"] / 1e9
          for b in json.load(open(os.path.join(d, "engine.json")))["benchmarks"]
          if b.get("aggregate_name") == "median"}
print("| measurement | kvtier-replay (median) | baseline, same run | ratio | target |")
print("|---|---|---|---|---|")
print("| full trace, G1 only, 128 B blocks | %.3f s | oracle.py, naive Python loop, no hashing or memory: %.3f s | %.2fx the time | <= 3 s |"
      % (g1, oracle, g1 / oracle))
print("| three tiers, whole run | %.2f s | - | - | - |" % statistics.median(r["seconds"] for r in tiers))
for direction, run in (("G1->G2", "BM_OffloadG1toG2/16384/0/1/1024/manual_time"),
                       ("G1->G3", "BM_OffloadG1toG3/1/16384/1024/manual_time"),
                       ("G3->G1", "BM_OnboardG3toG1/1/16384/1024/manual_time")):
    bw = statistics.median(r["transfers"][direction]["gb_per_s"] for r in tiers)
    print("| three tiers: %s | %.2f GB/s | engine benchmark, 1024 x 32 KiB: %.2f GB/s | %.2fx | >= 0.7x |"
          % (direction, bw, engine[run], bw / engine[run]))
one = engine["BM_Baseline_Memcpy/512/1024"]
print("| three tiers: G1->G2 | %.2f GB/s | one thread's plain memcpy of 32 MiB: %.2f GB/s | %.2fx | - |"
      % (statistics.median(r["transfers"]["G1->G2"]["gb_per_s"] for r in tiers), one,
         statistics.median(r["transfers"]["G1->G2"]["gb_per_s"] for r in tiers) / one))
cold = statistics.median(r["transfers"]["G1->G2"]["gb_per_s"] for r in load("cold-*.json"))
run = "BM_OffloadG1toG2/16384/0/1/1024/manual_time"
print("| three tiers: G1->G2, --no-prefault (G2 pages faulted in by the copies) | %.2f GB/s | engine benchmark, 1024 x 32 KiB: %.2f GB/s | %.2fx | - |"
      % (cold, engine[run], cold / engine[run]))
print("| prefault of G1 and G2 before the replay (not in the run's time) | %.2f s | - | - | - |"
      % statistics.median(r["prefault_seconds"] for r in tiers))
PY
