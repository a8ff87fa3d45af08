#!/usr/bin/env bash
# kvtier as a user installs it, from a build tree (default: build):
#   1. the .deb that `cpack -G DEB` makes: apt installs it, the examples build against it
#      through pkg-config and through find_package(kvtier) and print what they print from the
#      build tree, and the tools run from PATH;
#   2. the Python package: pip installs bindings/python (pyproject.toml), which then finds the
#      installed library through pkg-config, with no KVTIER_LIB_DIR;
#   3. the Rust crates: `cargo package` makes kvtier-sys and kvtier, and builds each from its
#      .crate alone (kvtier from a registry of Debian's crates plus kvtier-sys's .crate), on
#      the installed library and header.
# The package is removed at the end. It needs root and apt, and a machine where kvtier is not
# installed already: anywhere else it says SKIPPED, and why.
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-build}" && pwd)
skip() { echo "SKIPPED: $*"; exit 0; }
[ "$(id -u)" -eq 0 ] || skip "installing a .deb needs root"
command -v apt-get > /dev/null || skip "no apt-get"
if dpkg-query -W -f='${Status}' kvtier 2>/dev/null | grep -q "install ok installed"; then
  skip "a kvtier package is installed already, and this test would replace it"
fi
tmp=$(mktemp -d)
installed=0
cleanup() {
  if ((installed)); then DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq kvtier > /dev/null; fi
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }

echo "-- the .deb"
(cd "$build" && cpack -G DEB -B "$tmp/deb" > "$tmp/cpack.log" 2>&1) || { cat "$tmp/cpack.log"; exit 1; }
deb=$(ls "$tmp"/deb/kvtier_*.deb)
dpkg-deb -f "$deb" Package Version Depends
installed=1
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$deb" > "$tmp/apt.log" 2>&1 ||
  { cat "$tmp/apt.log"; exit 1; }
for f in /usr/include/kvtier.h /usr/lib/libkvtier.so.0 /usr/lib/pkgconfig/kvtier.pc \
         /usr/lib/cmake/kvtier/kvtierConfig.cmake; do
  dpkg -S "$f" > /dev/null || fail "the package does not hold $f"
done
[ "$(pkg-config --modversion kvtier)" = "$(dpkg-deb -f "$deb" Version)" ] ||
  fail "pkg-config says kvtier $(pkg-config --modversion kvtier)"
# The build tree's transcript of seed 003: the installed library must print the same.
want=$("$build/examples/connector_seed003")

echo "-- the examples through pkg-config"
for ex in prefix_hit:prefix_hit.c connector_seed003:connector/seed003.c scenario:scenario/scenario.c; do
  cc -std=c99 -Wall -Wextra -pedantic -Werror -o "$tmp/pc_${ex%%:*}" "$src/examples/${ex#*:}" \
    $(pkg-config --cflags --libs kvtier)
done
# Outputs are read whole before grep: with pipefail, grep -q leaving early would fail the
# writer's end of the pipe (SIGPIPE), and with it the check, now and then.
out=$("$tmp/pc_prefix_hit")
grep -q "hold the bytes request A computed: yes" <<< "$out" || fail "pkg-config's prefix_hit"
[ "$("$tmp/pc_connector_seed003")" = "$want" ] || fail "pkg-config's connector_seed003 printed otherwise"
"$tmp/pc_scenario" > /dev/null || fail "pkg-config's scenario"
out=$(ldd "$tmp/pc_prefix_hit")
grep -q "libkvtier.so.0 => /usr/lib/libkvtier.so.0" <<< "$out" ||
  fail "pkg-config's build did not load the installed library"

echo "-- the examples through find_package(kvtier)"
cmake -S "$src/tests/package" -B "$tmp/cmake" > "$tmp/cmake.log" 2>&1 &&
  cmake --build "$tmp/cmake" >> "$tmp/cmake.log" 2>&1 || { cat "$tmp/cmake.log"; exit 1; }
out=$("$tmp/cmake/prefix_hit")
grep -q "hold the bytes request A computed: yes" <<< "$out" || fail "CMake's prefix_hit"
[ "$("$tmp/cmake/connector_seed003")" = "$want" ] || fail "CMake's connector_seed003 printed otherwise"
"$tmp/cmake/scenario" > /dev/null || fail "CMake's scenario"

echo "-- the tools on PATH"
for t in kvtier-replay kvtier-console kvtier-events kvtier-router; do
  [ "$(command -v "$t")" = "/usr/bin/$t" ] || fail "$t is not in /usr/bin"
  "$t" --help > /dev/null || fail "$t --help"
done

echo "-- pip install ./bindings/python"
# From a copy: setuptools writes its egg-info next to the sources.
cp -r "$src/bindings/python" "$tmp/python-src"
rm -rf "$tmp/python-src/tests" "$tmp/python-src"/kvtier/__pycache__
/usr/bin/python3 -m pip install -q --no-build-isolation --no-deps --no-index --target "$tmp/py" \
  "$tmp/python-src" > "$tmp/pip.log" 2>&1 || { cat "$tmp/pip.log"; exit 1; }
[ -f "$tmp/py/kvtier/py.typed" ] || fail "the pip-installed package lacks py.typed (PEP 561)"
cp "$src/bindings/python/examples/connector_seed003.py" "$tmp/"
got=$(cd "$tmp" && env -u KVTIER_LIB_DIR PYTHONPATH="$tmp/py" /usr/bin/python3 -c '
import kvtier, sys
assert kvtier.__file__.startswith(sys.argv[1]), kvtier.__file__
print(kvtier.version())' "$tmp/py") || fail "the pip-installed package: $got"
[ "$got" = "$(dpkg-deb -f "$deb" Version)" ] || fail "the pip-installed package loaded kvtier $got"
[ "$(cd "$tmp" && env -u KVTIER_LIB_DIR PYTHONPATH="$tmp/py" /usr/bin/python3 connector_seed003.py)" = "$want" ] ||
  fail "the pip-installed package's connector_seed003 printed otherwise"
echo "-- cargo package"
export CARGO_TARGET_DIR="$tmp/cargo"
cargo_package() {
  (cd "$src/bindings/rust" && cargo package -q --offline --allow-dirty -p "$@") \
    > "$tmp/cargo.log" 2>&1 || { cat "$tmp/cargo.log"; exit 1; }
}
cargo_package kvtier-sys
sys_crate=$(ls "$CARGO_TARGET_DIR"/package/kvtier-sys-*.crate)
# kvtier names kvtier-sys by version: a directory registry holds Debian's crates and it.
mkdir "$tmp/registry"
ln -s /usr/share/cargo/registry/* "$tmp/registry/"
tar xzf "$sys_crate" -C "$tmp/registry"
sys_dir=$(basename "$sys_crate" .crate)
echo "{\"files\":{},\"package\":\"$(sha256sum "$sys_crate" | cut -d' ' -f1)\"}" \
  > "$tmp/registry/$sys_dir/.cargo-checksum.json"
cargo_package kvtier --config "source.debian.directory=\"$tmp/registry\""
unset CARGO_TARGET_DIR
echo "packages: the .deb ($(du -h "$deb" | cut -f1)), the Python package and both crates install and build"
