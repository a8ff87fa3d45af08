#!/usr/bin/env bash
# What the observe call sites cost while nobody reads the stream (issue 13's goal: <= 1%):
# the same binaries run against the library as built (call sites present, nobody
# subscribed) and against a baseline library whose call sites are compiled out
# (-DKVT_NO_OBSERVE=ON, built here into BUILD-noobs), runs alternating so that both see the
# same machine load. Measured: bench_connector's ConnectorStep Miss/Hit steps (median of the
# per-iteration medians) and the whole-trace kvtier-replay --mode engine (median seconds).
#   bench/observe_cost.sh [build dir, default build] [runs, default 5]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
runs=${2:-5}
base=$build-noobs
tools/build.sh "$base" -DKVT_NO_OBSERVE=ON -DKVT_BUILD_TESTS=OFF -DKVT_BUILD_BENCH=OFF \
  -DKVT_BUILD_EXAMPLES=OFF -DKVT_BUILD_REPLAY=OFF -DKVT_BUILD_ROUTER=OFF > "$base.log" 2>&1 \
  || { tail -30 "$base.log"; exit 1; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
trace=examples/traces/conversation_trace.jsonl
for i in $(seq "$runs"); do
  for lib in obs noobs; do
    dir=$build/src
    [ "$lib" = noobs ] && dir=$base/src
    LD_LIBRARY_PATH=$dir "$build/bench/bench_connector" \
      --benchmark_filter='^BM_ConnectorStep_(Miss|Hit)/(16|256)/' \
      --benchmark_format=json > "$out/step-$lib-$i.json"
    LD_LIBRARY_PATH=$dir "$build/bin/kvtier-replay" --trace $trace --mode engine --json \
      --no-progress > "$out/engine-$lib-$i.json"
  done
done
/usr/bin/python3 - "$out" "$runs" <<'PY'
import glob, json, os, statistics, sys
d, runs = sys.argv[1], int(sys.argv[2])
def steps(lib):
    by = {}
    for f in glob.glob(os.path.join(d, "step-%s-*.json" % lib)):
        for b in json.load(open(f))["benchmarks"]:
            name = b["name"].split("/iterations")[0].replace("BM_ConnectorStep_", "")
            by.setdefault(name, []).append(b["p50_ns"])
    return {k: statistics.median(v) for k, v in by.items()}
obs, noobs = steps("obs"), steps("noobs")
print("| measurement (median of %d runs) | call sites present, nobody reading | compiled out, same run | ratio | goal |" % runs)
print("|---|---|---|---|---|")
for k in ("Miss/16", "Miss/256", "Hit/16", "Hit/256"):
    print("| connector step %s (p50) | %.0f ns | %.0f ns | %.3fx | <= 1.01x |" % (k, obs[k], noobs[k], obs[k] / noobs[k]))
sec = lambda lib: statistics.median(json.load(open(f))["seconds"] for f in glob.glob(os.path.join(d, "engine-%s-*.json" % lib)))
e, b = sec("obs"), sec("noobs")
print("| whole trace, --mode engine | %.2f s | %.2f s | %.3fx | <= 1.01x |" % (e, b, e / b))
PY
