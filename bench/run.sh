#!/usr/bin/env bash
# Runs the benchmarks (5 repetitions each) and prints the medians and the ratios to their
# same-run baselines as the markdown tables of docs/BENCHMARKS.md.
#   bench/run.sh [build dir, default build]
# KVT_BENCH_DIR chooses where G3 files and the dd baseline go (default /var/tmp/kvtier-bench).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
echo "## core"
"$build/bench/bench_core" --benchmark_repetitions=5 --benchmark_min_time=0.5 \
  --benchmark_report_aggregates_only=true --benchmark_format=json > "$out"
/usr/bin/python3 bench/report.py "$out"
echo
echo "## transfers"
"$build/bench/bench_transfer" --benchmark_repetitions=5 --benchmark_min_time=0.5 \
  --benchmark_report_aggregates_only=true --benchmark_format=json > "$out"
/usr/bin/python3 bench/report_transfer.py "$out"
echo
echo "## concurrent transfers"
"$build/bench/bench_concurrency" --benchmark_repetitions=5 --benchmark_min_time=0.5 \
  --benchmark_report_aggregates_only=true --benchmark_format=json > "$out"
/usr/bin/python3 bench/report_concurrency.py "$out"
echo
echo "## connector bookkeeping"
"$build/bench/bench_connector" --benchmark_repetitions=5 \
  --benchmark_report_aggregates_only=true --benchmark_format=json > "$out"
/usr/bin/python3 bench/report_connector.py "$out"
