#!/bin/sh
# Fails if libkvtier.so exports a symbol outside the kvt_ prefix (the version node
# KVTIER_0 aside), misses the SONAME, or lacks either config init: kvt_manager_config_init_sized,
# and kvt_manager_config_init, which binaries built against the 0.1.0 header still call (the
# header's inline wrapper of that name replaces it for newer sources).
lib="$1"
syms=$(nm -D --defined-only "$lib" | awk '{print $NF}' | sed 's/@.*//')  # names without @@KVTIER_0
bad=$(echo "$syms" | grep -v -e '^kvt_' -e '^KVTIER_0$')
if [ -n "$bad" ]; then echo "exported outside kvt_:"; echo "$bad"; exit 1; fi
count=$(echo "$syms" | grep -c '^kvt_')
[ "$count" -ge 30 ] || { echo "only $count kvt_ symbols exported"; exit 1; }
echo "$syms" | grep -qx 'kvt_manager_config_init_sized' ||
  { echo "kvt_manager_config_init_sized is not exported"; exit 1; }
echo "$syms" | grep -qx 'kvt_manager_config_init' ||
  { echo "kvt_manager_config_init (0.1.0's) is not exported"; exit 1; }
readelf -d "$lib" | grep -q 'SONAME.*libkvtier.so.0' || { echo "SONAME is not libkvtier.so.0"; exit 1; }
echo "$count kvt_ symbols, nothing else exported, SONAME libkvtier.so.0"
