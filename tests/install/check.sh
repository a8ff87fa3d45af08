#!/bin/sh
# Installs kvtier from a build tree into a temporary prefix, then builds and runs a consumer
# twice: through find_package(kvtier) and through pkg-config. Also checks the build-tree
# kvtier.pc. Both .pc files must hold absolute paths that exist, so that they work from any
# directory (the Rust build from a build tree outside the repository runs in
# tools/test-bindings.sh). Usage: check.sh SOURCE_DIR BUILD_DIR
set -e
src=$1
build=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" > "$tmp/install.log"
cmake -S "$src/tests/install" -B "$tmp/consumer" -DCMAKE_PREFIX_PATH="$tmp/prefix" > "$tmp/cfg.log"
cmake --build "$tmp/consumer" > "$tmp/build.log"
LD_LIBRARY_PATH="$tmp/prefix/lib" "$tmp/consumer/consumer"
libdir=$(ls -d "$tmp/prefix"/lib*/pkgconfig | head -1)
# Each directory of the .pc file in $1: an absolute path under $2 that exists.
absolute() {
  for var in libdir includedir; do
    dir=$(PKG_CONFIG_PATH="$1" pkg-config --variable=$var kvtier)
    case "$dir" in
      "$2"/*) test -d "$dir" || { echo "$1/kvtier.pc: $var $dir does not exist"; exit 1; } ;;
      *) echo "$1/kvtier.pc: $var is $dir, not an absolute path under $2"; exit 1 ;;
    esac
  done
}
absolute "$libdir" "$tmp/prefix"
absolute "$build" ""  # anywhere, as long as absolute
PKG_CONFIG_PATH="$libdir" cc -o "$tmp/pc" "$src/tests/install/consumer.c" \
  $(PKG_CONFIG_PATH="$libdir" pkg-config --cflags --libs kvtier)
"$tmp/pc"
PKG_CONFIG_PATH="$build" cc -o "$tmp/pc_build" "$src/tests/install/consumer.c" \
  $(PKG_CONFIG_PATH="$build" pkg-config --cflags --libs kvtier)
"$tmp/pc_build"
