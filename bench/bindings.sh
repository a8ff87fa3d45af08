#!/usr/bin/env bash
# Binding call overhead: one kvt_tier_match_prefix of one block from C, Rust, Python and Go, in
# the same run; prints the table of docs/BENCHMARKS.md.   bench/bindings.sh [build dir]
set -euo pipefail
cd "$(dirname "$0")/.."
build=$PWD/${1:-build}
export PKG_CONFIG_PATH=$build KVTIER_LIB_DIR=$build/src GOPROXY=off PATH=/usr/bin:$PATH
out=$(mktemp)
trap 'rm -f "$out"' EXIT
"$build/bench/match_call" >> "$out"
(cd bindings/rust && cargo run -q --offline --release --example match_bench) >> "$out"
/usr/bin/python3 bindings/python/examples/match_bench.py >> "$out"
(cd bindings/go && go test -run '^$' -bench MatchPrefix1 -count 5 .) |
  awk '/^BenchmarkMatchPrefix1/ {print $3}' | sort -n | sed -n 3p | sed 's/^/go /; s/$/ ns\/call/' >> "$out"
/usr/bin/python3 - "$out" <<'PY'
import sys
v = {l.split()[0]: float(l.split()[1]) for l in open(sys.argv[1])}
c = v["c"]
print("| caller | ns per call (median of 5) | vs C | overhead | target |")
print("|---|---|---|---|---|")
targets = {"rust": "<= 1.2x C", "go": "<= 150 ns overhead", "python": "<= 1500 ns per call",
           "python-array": "<= 1500 ns per call", "python-batch5000": "usable at 1000s of blocks"}
for k in ("c", "rust", "go", "python", "python-array", "python-batch5000"):
    unit = "ns/block" if "batch" in k else "ns"
    print("| %s | %.1f %s | %.2fx | %+.1f ns | %s |" % (k, v[k], unit, v[k] / c, v[k] - c,
                                                     targets.get(k, "baseline")))
PY
