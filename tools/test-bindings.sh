#!/usr/bin/env bash
# The binding suites, against the library in a build tree (default build/): Rust, Python,
# Go, then seed 003's scenario in C, Rust, Python and Go, and its run through the connector,
# each compared line by line. C's own binding tests (examples/dlopen, examples/scenario) run
# in ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
build=$root/${1:-build}
export PKG_CONFIG_PATH=$build KVTIER_LIB_DIR=$build/src GOPROXY=off GOFLAGS=-modcacherw
if [ -z "${VLLM_SRC:-}" ] && [ -d "$root/../shared/vllm/vllm" ]; then
  export VLLM_SRC=$root/../shared/vllm  # vLLM's own code judges kvtier.vllm (docs/VLLM.md)
fi
# Debian's cargo and rustc, which read Debian's crate registry (bindings/rust/.cargo).
export PATH=/usr/bin:$PATH

echo "== every exported call and config field, in Python, Rust and Go"
/usr/bin/python3 tools/check_binding_parity.py
echo "== Rust: cargo test"
(cd bindings/rust && cargo test --offline -q 2>&1 | grep -E "test result|error|panicked|FAILED")
echo "== Rust: kvtier-sys and kvtier against a build tree outside the repository"
outside=$(mktemp -d)
trap 'rm -rf "$outside"' EXIT
cmake -S . -B "$outside/build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVT_BUILD_TESTS=OFF \
  -DKVT_BUILD_BENCH=OFF -DKVT_BUILD_EXAMPLES=OFF -DKVT_BUILD_REPLAY=OFF > "$outside/log" 2>&1 &&
  cmake --build "$outside/build" -j"$(nproc)" --target kvtier > "$outside/log" 2>&1 ||
  { cat "$outside/log"; exit 1; }
(cd bindings/rust && env -u KVTIER_LIB_DIR PKG_CONFIG_PATH="$outside/build" cargo test --offline -q 2>&1 |
  grep -E "test result|error|panicked|FAILED")
echo "== Python: the shipped cffi declarations, pytest"
/usr/bin/python3 bindings/python/gen_cdef.py --check
/usr/bin/python3 -m pytest -q -p no:cacheprovider bindings/python/tests
echo "== Go: vet, test, race"
(cd bindings/go && go vet ./... && go test -a -count=1 ./... && go test -race -count=1 ./...)

echo "== seed 003 in four languages"
c=$("$build/examples/scenario")
rust=$(cd bindings/rust && cargo run -q --offline --example scenario)
python=$(/usr/bin/python3 bindings/python/examples/scenario.py)
go=$(cd bindings/go && go run ./cmd/scenario)
for lang in rust python go; do
  if ! diff <(echo "$c") <(echo "${!lang}"); then
    echo "test-bindings: the $lang scenario differs from C's"
    exit 1
  fi
done
echo "$c"
echo "identical output from C, Rust, Python and Go"

echo "== seed 003 through the connector in four languages"
c=$("$build/examples/connector_seed003")
rust=$(cd bindings/rust && cargo run -q --offline --example connector_seed003)
python=$(/usr/bin/python3 bindings/python/examples/connector_seed003.py)
go=$(cd bindings/go && go run ./cmd/connector_seed003)
for lang in rust python go; do
  if ! diff <(echo "$c") <(echo "${!lang}"); then
    echo "test-bindings: the $lang connector transcript differs from C's"
    exit 1
  fi
done
echo "$c"
echo "identical connector transcripts from C, Rust, Python and Go"
