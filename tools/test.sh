#!/usr/bin/env bash
# Quick start 2: install what is missing, build, and run every test suite:
#   1. the unit tests, examples and header/export checks (ctest);
#   2. the same tests under AddressSanitizer + UndefinedBehaviorSanitizer;
#   3. the concurrency tests under ThreadSanitizer.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install-deps.sh

echo "== build and test (RelWithDebInfo)"
tools/build.sh build > build.log 2>&1 || { tail -50 build.log; exit 1; }
ctest --test-dir build --output-on-failure -j"$(nproc)"

echo "== ASan + UBSan"
tools/build.sh build-asan -DKVT_SANITIZE=address,undefined -DKVT_BUILD_BENCH=OFF \
  > build-asan.log 2>&1 || { tail -50 build-asan.log; exit 1; }
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-asan --output-on-failure -j"$(nproc)" -R '^[A-Z][A-Za-z]+\.'

echo "== TSan (concurrency tests)"
tools/build.sh build-tsan -DKVT_SANITIZE=thread -DKVT_BUILD_BENCH=OFF -DKVT_BUILD_EXAMPLES=OFF \
  > build-tsan.log 2>&1 || { tail -50 build-tsan.log; exit 1; }
TSAN_OPTIONS=halt_on_error=1 ctest --test-dir build-tsan --output-on-failure -R '^Threads\.'
