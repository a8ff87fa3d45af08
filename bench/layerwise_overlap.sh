#!/usr/bin/env bash
# How much the connector's copies add to an engine step when they overlap the forward pass
# layer by layer (issue 23): kvtier-replay --mode engine with a simulated forward of
# --layer-forward-us per layer, each run timing its steps with the connector's loads and
# stores and then the same steps' forwards without the connector (--compare-bare), on the
# first requests of the Mooncake trace (docs/BENCHMARKS.md; goal: 1.1x or less when a
# layer's forward outlasts its copies):
#   bench/layerwise_overlap.sh [build dir, default build] [runs, default 5] [requests, 1000]
#       [µs per layer, 200]
# With KVT_BASE_LIB set to a directory holding another libkvtier.so.0 (an earlier worker),
# each run is followed by the same run against that library, for a before/after.
# KVT_REPLAY_ARGS: more kvtier-replay options, which win over the ones below.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
runs=${2:-5}
requests=${3:-1000}
layer_us=${4:-200}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
head -n "$requests" examples/traces/conversation_trace.jsonl > "$out/trace.jsonl"
# 8 layers of 2 x 16 KiB per block (256 KiB blocks), G1 2,000 and G2 8,000 of them, no G3:
# the stores go to G2, so G3 would only cost its file.
args=(--trace "$out/trace.jsonl" --json --mode engine --no-progress --layers 8
      --chunk-bytes 16384 --g1-blocks 2000 --g2-blocks 8000 --g3-blocks 0
      --layer-forward-us "$layer_us" --compare-bare ${KVT_REPLAY_ARGS:-})
for i in $(seq "$runs"); do
  "$build/bin/kvtier-replay" "${args[@]}" > "$out/after-$i.json"
  if [[ -n ${KVT_BASE_LIB:-} ]]; then
    LD_LIBRARY_PATH=$KVT_BASE_LIB "$build/bin/kvtier-replay" "${args[@]}" > "$out/before-$i.json"
  fi
done
/usr/bin/python3 - "$out" "$layer_us" <<'PY'
import glob, json, os, statistics, sys
d, layer_us = sys.argv[1], sys.argv[2]
def load(name):
    return [json.load(open(f)) for f in sorted(glob.glob(os.path.join(d, name + "-*.json")))]
def spread(xs):
    return "%.0f-%.0f" % (min(xs), max(xs))
print("| worker | step, median of %d runs (spread) | bare step, same runs (spread) "
      "| ratio | target |" % len(load("after")))
print("|---|---|---|---|---|")
for name in ("before", "after"):
    rs = load(name)
    if not rs:
        continue
    step = [r["step_wall_us"]["median"] for r in rs]
    bare = [r["bare_step_wall_us"]["median"] for r in rs]
    mean = [r["step_wall_us"]["mean"] for r in rs]
    ratios = [s / b for s, b in zip(step, bare)]
    print("| %s | %.0f us (%s), mean %.0f us | %.0f us (%s) | %.3fx (runs %.3f-%.3f) | <= 1.1x |" % (
        name, statistics.median(step), spread(step), statistics.median(mean),
        statistics.median(bare), spread(bare), statistics.median(step) / statistics.median(bare),
        min(ratios), max(ratios)))
r = load("after")[0]
print("\n%d steps, %d tokens loaded, %d blocks stored, %d verified, %d mismatched; "
      "%s us of forward per layer, 8 layers" % (r["steps"], r["loaded_tokens"],
      r["stored_blocks"], r["verified_blocks"], r["mismatched_blocks"], layer_us))
PY
