#!/usr/bin/env bash
# The checks that need an NVIDIA GPU, on a machine that has one:
#   bench/cuda.sh [build dir, default build] [trace, default ../shared/traces/conversation_trace.jsonl]
#   1. the unit test suite, Cuda.* included, which must run rather than skip; then the Cuda.*
#      tests again under compute-sanitizer (memcheck) when it is installed; and, where python3
#      has torch, kvtier.vllm's layout reader over torch's CUDA tensors (bench/vllm_layout_torch.py);
#   2. bench_cuda_copy: scattered D2H/H2D copies against one contiguous copy (markdown table);
#   3. kvtier-replay --g1-memory cuda on the trace (blocks and engine modes; G3 in
#      KVT_BENCH_DIR, default /var/tmp/kvtier-bench), bandwidth per direction.
# Logs and JSON go to KVT_GPU_OUT (default BUILD/gpu). KVT_GPU_STEPS picks steps (default
# "tests bench replay").
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
trace=${2:-../shared/traces/conversation_trace.jsonl}
out=${KVT_GPU_OUT:-$build/gpu}
g3=${KVT_BENCH_DIR:-/var/tmp/kvtier-bench}
steps=${KVT_GPU_STEPS:-tests bench replay}
mkdir -p "$out" "$g3"
nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.current,pcie.link.width.current \
  --format=csv | tee "$out/gpu.txt"

if [[ " $steps " == *" tests "* ]]; then
  echo "== the Cuda tests, which must run rather than skip"
  "$build/tests/kvtier_tests" --gtest_filter='Cuda.*' > "$out/cuda_tests.log" 2>&1 ||
    { tail -80 "$out/cuda_tests.log"; exit 1; }
  if grep -q "SKIPPED" "$out/cuda_tests.log"; then
    grep -B2 SKIPPED "$out/cuda_tests.log"
    echo "the Cuda tests skipped on a machine with a GPU"
    exit 1
  fi
  grep -E "^\[ +(OK|PASSED) " "$out/cuda_tests.log"
  if command -v compute-sanitizer > /dev/null; then
    compute-sanitizer --tool memcheck --error-exitcode 3 "$build/tests/kvtier_tests" \
      --gtest_filter='Cuda.*' > "$out/memcheck.log" 2>&1 || { tail -60 "$out/memcheck.log"; exit 1; }
    grep "ERROR SUMMARY" "$out/memcheck.log" || true
  fi
  echo "== the whole unit test suite on the GPU machine"
  "$build/tests/kvtier_tests" --gtest_brief=1 > "$out/tests.log" 2>&1 ||
    { tail -80 "$out/tests.log"; exit 1; }
  tail -3 "$out/tests.log"
fi

if [[ " $steps " == *" tests "* ]] && python3 -c "import torch" 2> /dev/null; then
  echo "== kvtier.vllm's layout reader over torch's CUDA tensors"
  python3 bench/vllm_layout_torch.py | tee "$out/vllm_layout_torch.txt"
fi

if [[ " $steps " == *" bench "* ]]; then
  echo "== scattered copies"
  KVT_BENCH_JSON="$out/bench_cuda_copy.jsonl" "$build/bench/bench_cuda_copy" |
    tee "$out/bench_cuda_copy.md"
fi

[[ " $steps " == *" replay "* ]] || exit 0
echo "== kvtier-replay --g1-memory cuda"
replay() {  # name, then kvtier-replay's arguments
  local name=$1
  shift
  rm -rf "${g3:?}/$name"
  mkdir -p "$g3/$name"
  "$build/bin/kvtier-replay" --trace "$trace" --g1-memory cuda --g3-path "$g3/$name" --json "$@" \
    > "$out/replay_$name.json"
  /usr/bin/env python3 - "$out/replay_$name.json" "$name" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
hits = (f"loaded {r['loaded_tokens']} tokens, stored {r['stored_blocks']} blocks"
        if r.get("mode") == "engine" else f"hit rate {r['hit_rate']:.3f}")
print(f"{sys.argv[2]}: {r['seconds']:.1f} s, {hits}, verified {r['verified_blocks']}, "
      f"mismatched {r['mismatched_blocks']}")
for d, t in r.get("transfers", {}).items():
    if t.get("blocks"):
        print(f"  {d}: {t['blocks']} blocks, {t.get('bytes', 0) / 1e9:.2f} GB, "
              f"{t.get('gb_per_s', 0):.2f} GB/s")
PY
}
replay blocks_32k
replay engine_32k --mode engine
replay blocks_512k --layers 32 --chunk-bytes 8192 --g1-blocks 4000 --g2-blocks 8000 --g3-blocks 16000
replay engine_512k --mode engine --layers 32 --chunk-bytes 8192 --g1-blocks 4000 --g2-blocks 8000 \
  --g3-blocks 16000
