#!/usr/bin/env bash
# Runs the core benchmarks (5 repetitions) and prints the medians and the ratios to their
# same-run baselines as the markdown table in docs/BENCHMARKS.md.
#   bench/run.sh [build dir, default build]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
out=$(mktemp)
"$build/bench/bench_core" --benchmark_repetitions=5 --benchmark_min_time=0.5 \
  --benchmark_report_aggregates_only=true --benchmark_format=json > "$out"
/usr/bin/python3 bench/report.py "$out"
rm -f "$out"
