#!/usr/bin/env bash
# Hit rates of the eviction policies (LRU, S3-FIFO) in G2 and G3 on the shipped Mooncake
# trace, through kvtier-replay at several capacities (docs/BENCHMARKS.md, "Eviction").
# G1 stays LRU at 4,000 blocks; blocks are 128 B, as hit counts do not depend on their size.
#   bench/eviction_hits.sh [build dir, default build] [trace]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
trace=${2:-examples/traces/conversation_trace.jsonl}
g3dir=$(mktemp -d)
trap 'rm -rf "$g3dir"' EXIT
run() {  # G2 G3 EVICTION(G1,G2,G3) -> "hits g2_hits g3_hits"
  "$build/bin/kvtier-replay" --trace "$trace" --chunk-bytes 64 --no-progress --no-prefault \
    --json --g2-blocks "$1" --g3-blocks "$2" --g3-path "$g3dir" --eviction "$3" |
    /usr/bin/python3 -c 'import json,sys; r=json.load(sys.stdin); print(r["blocks"]-r["miss_blocks"], r["g2_hit_blocks"], r["g3_hit_blocks"], r["blocks"])'
}
echo "| G1 | G2 | G3 | policy (G2, G3) | lower-tier hits (G2 + G3) | all hits | hit rate | S3-FIFO vs LRU, lower-tier hits |"
echo "|---|---|---|---|---|---|---|---|"
for caps in "2000 0" "5000 0" "10000 0" "20000 0" "40000 0" "0 10000" "0 30000" "0 60000" \
            "5000 20000" "20000 60000"; do
  set -- $caps
  read -r lh l2 l3 n <<< "$(run "$1" "$2" lru,lru,lru)"
  read -r sh s2 s3 _ <<< "$(run "$1" "$2" lru,s3fifo,s3fifo)"
  for p in lru s3fifo; do
    if [ $p = lru ]; then h=$lh; lo=$((l2 + l3)); else h=$sh; lo=$((s2 + s3)); fi
    gain=$(/usr/bin/python3 -c "l=$((l2 + l3)); s=$((s2 + s3)); print('%+.1f %%' % (100.0 * (s - l) / l) if l else '-')")
    printf '| 4,000 | %s | %s | %s | %s | %s | %s | %s |\n' "$1" "$2" "$p" "$lo" "$h" \
      "$(/usr/bin/python3 -c "print('%.2f %%' % (100.0 * $h / $n))")" "$([ $p = s3fifo ] && echo "$gain" || echo)"
  done
done
