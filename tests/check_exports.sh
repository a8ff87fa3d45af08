#!/bin/sh
# Fails if libkvtier.so exports a symbol outside the kvt_ prefix (the version nodes aside),
# misses the SONAME or a call the header declares (HEADER, the second argument: a call that
# src/kvtier.map lists in no node is not exported), or lacks either config init:
# kvt_manager_config_init_sized, and kvt_manager_config_init, which binaries built against
# the 0.1.0 header still call (the header's inline wrapper of that name replaces it for
# newer sources).
lib="$1" header="$2"
syms=$(nm -D --defined-only "$lib" | awk '{print $NF}' | sed 's/@.*//')  # names without @@KVTIER_x
bad=$(echo "$syms" | grep -v -e '^kvt_' -e '^KVTIER_[0-9.]*$')
if [ -n "$bad" ]; then echo "exported outside kvt_:"; echo "$bad"; exit 1; fi
count=$(echo "$syms" | grep -c '^kvt_')
[ "$count" -ge 30 ] || { echo "only $count kvt_ symbols exported"; exit 1; }
echo "$syms" | grep -qx 'kvt_manager_config_init_sized' ||
  { echo "kvt_manager_config_init_sized is not exported"; exit 1; }
echo "$syms" | grep -qx 'kvt_manager_config_init' ||
  { echo "kvt_manager_config_init (0.1.0's) is not exported"; exit 1; }
declared=$(grep -h '^KVT_API' "$header" | grep -o 'kvt_[a-z0-9_]*(' | tr -d '(' | sort -u)
missing=""
for n in $declared; do echo "$syms" | grep -qx "$n" || missing="$missing $n"; done
[ -z "$missing" ] || { echo "declared, not exported (list them in src/kvtier.map):$missing"; exit 1; }
readelf -d "$lib" | grep -q 'SONAME.*libkvtier.so.0' || { echo "SONAME is not libkvtier.so.0"; exit 1; }
echo "$count kvt_ symbols, nothing else exported, SONAME libkvtier.so.0"
