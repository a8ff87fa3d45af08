#!/usr/bin/env bash
# The GPU checks, run on the GPU machine from a folder that bench/gpu_bundle.sh packed:
#   DIR/gpu_ab.sh [STEPS]  (default "1 2 3 4 5 6"; logs and JSON go to $OUT, else /tmp/gpu_ab)
# 1. the Cuda tests with the new library, which must run, not skip;
# 2. bench_cuda_copy --kvtier-only, the old library (if packed) and the new one alternated,
#    twice: the library alone against one contiguous copy, each copy checked word by word;
# 3. a vLLM-shaped engine replay (32 layers of K and V, 16-token blocks, 32 KiB chunks):
#    stores and loads of eight requests, checked word by word; then the first 40 requests
#    of the trace with each library, twice, alternated;
# 4. bench_cuda_copy with every method, new library;
# 5. compute-sanitizer memcheck of the Cuda tests, when it is installed;
# 6. bench_cuda_copy --phases, each library: where a small offload's time goes.
# Each step has its own time limit; all six take about 9 minutes on an H200.
set -u
G=$(cd "$(dirname "$0")" && pwd)
O=${OUT:-/tmp/gpu_ab}
mkdir -p "$O"
use() { export LD_LIBRARY_PATH=$G/$1:$G/lib; }
libs=new
steps=" ${1:-1 2 3 4 5 6} "
step() { [[ "$steps" == *" $1 "* ]]; }
[[ -d "$G/old" ]] && libs="old new"
secs() { awk "BEGIN{print $EPOCHREALTIME - $1}"; }
command -v nvidia-smi > /dev/null || { echo "gpu_ab: no nvidia-smi here: not a GPU machine" >&2; exit 1; }
exec > >(tee "$O/log.txt") 2>&1
date -u
nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.current,pcie.link.width.current \
  --format=csv
if step 1; then
echo "== 1. the Cuda tests, new library"
use new
timeout 100 "$G/bin/kvtier_tests" --gtest_filter='Cuda.*' > "$O/cuda_tests.log" 2>&1
echo "rc=$?"
grep -E "^\[ +(OK|FAILED|SKIPPED|PASSED) " "$O/cuda_tests.log"
fi
if step 6; then
echo "== 6. where a small offload's time goes ($libs)"
for lib in $libs; do
  use "$lib"
  echo "-- $lib"
  timeout 60 "$G/bin/bench_cuda_copy" --phases
  echo "rc=$?"
done
fi
if step 2; then
echo "== 2. the library alone ($libs), alternated"
for round in 1 2; do
  for lib in $libs; do
    use "$lib"
    echo "-- $lib, round $round"
    t0=$EPOCHREALTIME
    KVT_BENCH_JSON=$O/kv_${lib}_$round.jsonl timeout 80 "$G/bin/bench_cuda_copy" --kvtier-only |
      grep -E "^\| |device|wrong"
    echo "rc=${PIPESTATUS[0]} secs=$(secs "$t0")"
  done
done
fi
if step 3; then
echo "== 3. a vLLM-shaped engine replay"
echo "-- stores from the device and loads back, checked word by word (new library)"
use new
timeout 60 "$G/bin/kvtier-replay" --trace "$G/loads.jsonl" --mode engine --page-size 16 \
  --layers 32 --chunk-bytes 32768 --g1-memory cuda --g1-blocks 800 --g2-blocks 4000 \
  --g3-blocks 0 --max-running 2 --json --no-progress > "$O/replay_loads.json"
echo "rc=$?"
python3 - "$O/replay_loads.json" <<'PY' || true
import json, sys
r = json.load(open(sys.argv[1]))
print({k: r.get(k) for k in ("stored_blocks", "loaded_tokens", "verified_blocks",
                             "mismatched_blocks")})
PY
for round in 1 2; do
for lib in $libs; do
  use "$lib"
  t0=$EPOCHREALTIME
  f=$O/replay_${lib}_$round.json
  timeout 60 "$G/bin/kvtier-replay" --trace "$G/trace.jsonl" --mode engine --page-size 16 \
    --layers 32 --chunk-bytes 32768 --g1-memory cuda --g1-blocks 8000 --g2-blocks 2000 \
    --g3-blocks 0 --max-running 4 --compare-bare --json --no-progress > "$f"
  echo "$lib round $round rc=$? secs=$(secs "$t0")"
  [[ -s "$f" ]] || continue
  python3 - "$f" <<'PY' || true
import json, sys
r = json.load(open(sys.argv[1]))
print({k: r.get(k) for k in ("seconds", "steps", "stored_blocks", "loaded_tokens",
                             "mismatched_blocks", "step_wall_us", "bare_step_wall_us")})
for d, v in r["transfers"].items():
    if v["blocks"]:
        print(d, v)
PY
done
done
fi
if step 4; then
echo "== 4. every method, new library"
use new
timeout 120 "$G/bin/bench_cuda_copy" > "$O/bench_all.md" 2>&1
echo "rc=$?"
cat "$O/bench_all.md"
fi
if step 5 && command -v compute-sanitizer > /dev/null; then
  echo "== 5. memcheck of the Cuda tests, new library"
  timeout 110 compute-sanitizer --tool memcheck --error-exitcode 3 "$G/bin/kvtier_tests" \
    --gtest_filter='Cuda.*' > "$O/memcheck.log" 2>&1
  echo "rc=$?"
  grep -E "ERROR SUMMARY|PASSED|FAILED" "$O/memcheck.log" | tail -5
fi
date -u
