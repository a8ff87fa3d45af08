#!/usr/bin/env bash
# Builds the libFuzzer targets with clang under ASan+UBSan (build-fuzz/) and runs each for
# SECONDS from its committed corpus:   tools/fuzz.sh [SECONDS] [TARGET...]
# New inputs go to build-fuzz/corpus/<name>/ (the committed corpus is only read); a crash
# leaves build-fuzz/crash-<name>-* and fails the run. See docs/FUZZING.md.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
shift || true
targets=("$@")
((${#targets[@]})) || targets=(api config hash connector_meta kv_events g4_value resp_reader event_log
  endpoint_line replay_request cluster_slots)
CC=clang CXX=clang++ tools/build.sh build-fuzz -DKVT_FUZZ=ON -DKVT_SANITIZE=address,undefined \
  -DKVT_CUDA=OFF -DKVT_BUILD_TESTS=OFF -DKVT_BUILD_BENCH=OFF -DKVT_BUILD_EXAMPLES=OFF \
  -DKVT_BUILD_REPLAY=OFF -DKVT_BUILD_ROUTER=OFF > build-fuzz.log 2>&1 || { tail -50 build-fuzz.log; exit 1; }
# One target per core at a time; each one's log is printed (and a failure named) in order.
fuzz_one() {
  local t=$1
  mkdir -p "build-fuzz/corpus/$t"
  build-fuzz/fuzz/fuzz_"$t" -max_total_time="$seconds" -rss_limit_mb=4096 \
    -print_final_stats=1 -artifact_prefix="build-fuzz/crash-$t-" \
    "build-fuzz/corpus/$t" "fuzz/corpus/$t" > "build-fuzz/fuzz_$t.log" 2>&1
}
jobs_max=$(nproc)
declare -A pid_of
failed=()
for t in "${targets[@]}"; do
  while (($(jobs -rp | wc -l) >= jobs_max)); do wait -n || true; done
  echo "fuzz_$t: started, $seconds s"
  fuzz_one "$t" &
  pid_of[$t]=$!
done
for t in "${targets[@]}"; do
  if wait "${pid_of[$t]}"; then
    grep -E "^stat::number_of_executed_units|^#[0-9]+.*DONE" "build-fuzz/fuzz_$t.log" | tail -2 \
      | sed "s/^/fuzz_$t: /"
  else
    echo "fuzz_$t FAILED:"
    tail -40 "build-fuzz/fuzz_$t.log"
    failed+=("$t")
  fi
done
((${#failed[@]} == 0)) || { echo "failed: ${failed[*]}"; exit 1; }
