#!/usr/bin/env bash
# What publishing KV events costs a whole replay (issue 25's row; goal 1.1x or less):
# kvtier-replay over the shipped trace without and with --kv-events (a PUB socket, nobody
# subscribed), alternating, wall time and CPU time per run (docs/BENCHMARKS.md):
#   bench/kv_events_replay.sh [build dir, default build] [runs, default 3]
# With KVT_BASE_LIB set to a directory holding another libkvtier.so.0, each pair is followed
# by the same pair against that library, for a before/after.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
runs=${2:-3}
port=${KVT_KV_EVENTS_PORT:-5599}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
run() {  # side, events (0/1), lib dir
  local args=(--trace examples/traces/conversation_trace.jsonl --json --no-progress)
  [[ $2 == 1 ]] && args+=(--kv-events "tcp://*:$port")  # bound: with nobody subscribed, PUB drops at once
  local t0 t1
  t0=$(date +%s.%N)
  LD_LIBRARY_PATH=$3 /usr/bin/time -f "%U %S" -o "$out/cpu" "$build/bin/kvtier-replay" \
    "${args[@]}" > /dev/null
  t1=$(date +%s.%N)
  echo "$1 $2 $(echo "$t1 - $t0" | bc) $(cat "$out/cpu")" >> "$out/runs"
}
for i in $(seq "$runs"); do
  for ev in 0 1; do run after $ev "$build/src"; done
  if [[ -n ${KVT_BASE_LIB:-} ]]; then
    for ev in 0 1; do run before $ev "$KVT_BASE_LIB"; done
  fi
done
/usr/bin/python3 - "$out/runs" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
print("| library | runs | without: wall, cpu | with --kv-events: wall, cpu | wall ratio (runs) | cpu added |")
print("|---|---:|---|---|---|---:|")
for side in ("before", "after"):
    mine = [r for r in rows if r[0] == side]
    if not mine:
        continue
    off = [r for r in mine if r[1] == "0"]
    on = [r for r in mine if r[1] == "1"]
    wall = lambda rs: statistics.median(float(r[2]) for r in rs)
    cpu = lambda rs: statistics.median(float(r[3]) + float(r[4]) for r in rs)
    pairs = [float(b[2]) / float(a[2]) for a, b in zip(off, on)]
    print("| %s | %d | %.2f s, %.2f s | %.2f s, %.2f s | %.3fx (%s) | %.2f s |" % (
        side, len(off), wall(off), cpu(off), wall(on), cpu(on), wall(on) / wall(off),
        ", ".join("%.2f" % p for p in pairs), cpu(on) - cpu(off)))
PY
