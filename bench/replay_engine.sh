#!/usr/bin/env bash
# kvtier-replay --mode engine against --mode blocks on the whole Mooncake trace, same
# capacities (the defaults), runs alternating so that both see the same machine load
# (docs/BENCHMARKS.md, issue 12's goal: engine within 2x):
#   bench/replay_engine.sh [build dir, default build] [runs per mode, default 3]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
runs=${2:-3}
trace=examples/traces/conversation_trace.jsonl
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for i in $(seq "$runs"); do
  "$build/bin/kvtier-replay" --trace $trace --json --mode blocks > "$out/blocks-$i.json"
  "$build/bin/kvtier-replay" --trace $trace --json --mode engine > "$out/engine-$i.json"
done
/usr/bin/python3 - "$out" <<'PY'
import glob, json, os, statistics, sys
d = sys.argv[1]
load = lambda mode: [json.load(open(f)) for f in sorted(glob.glob(os.path.join(d, mode + "-*.json")))]
blocks, engine = load("blocks"), load("engine")
b = statistics.median(r["seconds"] for r in blocks)
e = statistics.median(r["seconds"] for r in engine)
print("| measurement | --mode engine (median of %d) | --mode blocks, same run | ratio | target |" % len(engine))
print("|---|---|---|---|---|")
print("| full trace, default capacities, whole run | %.2f s | %.2f s | %.2fx the time | <= 2x |" % (e, b, e / b))
r = engine[0]
print("\nengine: %d steps, %d preemptions, %d tokens loaded (%d saved), %d blocks stored, "
      "%d verified, %d mismatched" % (r["steps"], r["preemptions"], r["loaded_tokens"],
      r["prefill_tokens_saved"], r["stored_blocks"], r["verified_blocks"], r["mismatched_blocks"]))
print("engine runs: %s s; blocks runs: %s s" % (
    ", ".join("%.2f" % x["seconds"] for x in engine), ", ".join("%.2f" % x["seconds"] for x in blocks)))
PY
