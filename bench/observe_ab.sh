#!/usr/bin/env bash
# The observe stream's cost to the connector step, before and after a change: bench_connector's
# ObservedPair benchmarks (one subscriber, the event log, an endpoint without a client, each
# against nobody reading in the same run) with this build's binary against another library
# and this build's, alternately, then tabled by bench/report_observed.py (docs/BENCHMARKS.md):
#   bench/observe_ab.sh BEFORE_LIB_DIR [build dir, default build] [runs, default 3]
# BEFORE_LIB_DIR holds the earlier libkvtier.so.0 (a worktree's build/src); the C ABI is the
# same, so one bench binary drives both.
set -euo pipefail
cd "$(dirname "$0")/.."
before=$1
build=${2:-build}
runs=${3:-3}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for i in $(seq "$runs"); do
  for side in before after; do
    lib=$build/src
    [[ $side == before ]] && lib=$before
    LD_LIBRARY_PATH=$lib "$build/bench/bench_connector" --benchmark_filter=ObservedPair \
      --benchmark_repetitions=5 --benchmark_report_aggregates_only=true \
      --benchmark_out="$out/$side$i.json" --benchmark_out_format=json > /dev/null 2>&1
  done
done
bench/report_observed.py "$out"
