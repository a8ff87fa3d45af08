#!/bin/sh
# Fails if libkvtier.so exports a symbol outside the kvt_ prefix (the version node
# KVTIER_0 aside), misses the SONAME, or still exports kvt_manager_config_init, which is a
# static inline wrapper over kvt_manager_config_init_sized since 0.2.0.
lib="$1"
syms=$(nm -D --defined-only "$lib" | awk '{print $NF}' | sed 's/@.*//')  # names without @@KVTIER_0
bad=$(echo "$syms" | grep -v -e '^kvt_' -e '^KVTIER_0$')
if [ -n "$bad" ]; then echo "exported outside kvt_:"; echo "$bad"; exit 1; fi
count=$(echo "$syms" | grep -c '^kvt_')
[ "$count" -ge 30 ] || { echo "only $count kvt_ symbols exported"; exit 1; }
echo "$syms" | grep -qx 'kvt_manager_config_init_sized' ||
  { echo "kvt_manager_config_init_sized is not exported"; exit 1; }
if echo "$syms" | grep -qx 'kvt_manager_config_init'; then
  echo "kvt_manager_config_init is exported: it is the header's inline wrapper"; exit 1
fi
readelf -d "$lib" | grep -q 'SONAME.*libkvtier.so.0' || { echo "SONAME is not libkvtier.so.0"; exit 1; }
echo "$count kvt_ symbols, nothing else exported, SONAME libkvtier.so.0"
