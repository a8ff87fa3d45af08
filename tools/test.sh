#!/usr/bin/env bash
# Quick start 2: install what is missing, build, and run every test suite:
#   1. ctest: unit tests, examples (dlopen, scenario), header/export/install checks, the
#      replay tool against its oracle, and every committed fuzz corpus file;
#   2. the bindings: Rust, Python, Go, and seed 003 compared across the four languages;
#   3. the unit tests and fuzz corpora under AddressSanitizer + UndefinedBehaviorSanitizer;
#   4. the concurrency, transfer and versioned-struct tests under ThreadSanitizer;
#   5. valgrind --leak-check=full on the unit tests and the fuzz corpora;
#   6. each libFuzzer target for FUZZ_SECONDS (default 30) from its corpus, under ASan+UBSan;
#   7. the packages: the .deb (cpack) installed with apt, the examples built against it with
#      pkg-config and find_package(kvtier), and `pip install ./bindings/python` on it.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install-deps.sh
# vLLM's own source (../shared/vllm: 31 files at upstream main 0231dd5), which judges
# kvtier.vllm (bindings/python/tests/test_vllm_scheduler.py) and the KV events
# (tools/kv_events); without it those tests skip, saying so.
if [ -z "${VLLM_SRC:-}" ] && [ -d ../shared/vllm ]; then
  VLLM_SRC=$(cd ../shared/vllm && pwd)
  export VLLM_SRC
fi
fuzz_seconds=${FUZZ_SECONDS:-30}
# Each stage says when it began, so that a slow stage shows in the log.
stage() { echo "== $* (at ${SECONDS} s)"; }

stage "build and test (RelWithDebInfo)"
tools/build.sh build > build.log 2>&1 || { tail -50 build.log; exit 1; }
ctest --test-dir build --output-on-failure -j"$(nproc)"

stage "bindings"
tools/test-bindings.sh build

stage "ASan + UBSan"
tools/build.sh build-asan -DKVT_SANITIZE=address,undefined -DKVT_BUILD_BENCH=OFF \
  -DKVT_BUILD_REPLAY=OFF > build-asan.log 2>&1 || { tail -50 build-asan.log; exit 1; }
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-asan --output-on-failure -j"$(nproc)" -R '^([A-Z][A-Za-z]+\.|fuzz_corpus_)'

stage "TSan (concurrency, transfer, observe, endpoint, parallel-connector, G4 name lookup and versioned-struct tests)"
tools/build.sh build-tsan -DKVT_SANITIZE=thread -DKVT_BUILD_BENCH=OFF -DKVT_BUILD_EXAMPLES=OFF \
  -DKVT_BUILD_REPLAY=OFF > build-tsan.log 2>&1 || { tail -50 build-tsan.log; exit 1; }
TSAN_OPTIONS="halt_on_error=1 suppressions=$PWD/tools/tsan.supp" \
  ctest --test-dir build-tsan --output-on-failure \
  -R '^(Threads|AbiVersioned|Xfer[A-Za-z]*|Observe|Breakpoints|Replay|Endpoint|ConnectorParallel|G4Resolve)\.'

stage "valgrind (memcheck, leaks)"
# --max-threads: one test holds KVT_MAX_MANAGERS managers at once, each with its threads.
# --fair-sched: valgrind runs one thread at a time, and its default lock let a busy thread
# (Threads.ResetWhile...'s matcher) starve the others for up to minutes, past a 20 s wait.
# G3 through I/O threads: valgrind does not see io_uring's writes into user buffers. The
# library reads no such switch; the test programs turn their G3 managers' g3_io to THREADS
# when KVTIER_TEST_G3_IO=threads (tests/support.hpp, fuzz/fuzz_api.cpp).
# KvEvents.ASubscriberThatNeverReads... is left to ASan: it encodes 64 MiB of batches, and
# under valgrind the heartbeat could drop its stuck subscriber before the budget is reached.
# Valgrind runs one thread at a time: the unit tests go in one shard per core (gtest's
# sharding), then the corpora.
vg() {
  KVTIER_TEST_G3_IO=threads valgrind -q --fair-sched=yes --max-threads=1100 --leak-check=full \
    --errors-for-leak-kinds=definite,indirect --error-exitcode=9 "$@"
}
shards=$(nproc)
pids=()
for ((i = 0; i < shards; ++i)); do
  GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i \
    vg build/tests/kvtier_tests '--gtest_filter=-Cuda.*:KvEvents.ASubscriberThatNeverReads*' \
    > "valgrind-$i.log" 2>&1 &
  pids+=($!)
done
failed=0
for ((i = 0; i < shards; ++i)); do
  if wait "${pids[i]}"; then
    echo "valgrind clean: kvtier_tests, shard $i of $shards"
  else
    tail -60 "valgrind-$i.log"
    failed=1
  fi
done
((failed == 0)) || exit 1
for t in api config hash connector_meta g4_value resp_reader kv_events event_log \
         endpoint_line replay_request cluster_slots; do
  vg "build/fuzz/replay_$t" "fuzz/corpus/$t" > valgrind.log 2>&1 || { tail -60 valgrind.log; exit 1; }
  echo "valgrind clean: replay_$t"
done

stage "libFuzzer, ${fuzz_seconds} s per target (clang, ASan + UBSan)"
tools/fuzz.sh "$fuzz_seconds"

stage "packages (.deb, pip)"
tools/test-packages.sh build
stage "done"
