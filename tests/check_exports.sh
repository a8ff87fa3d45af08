#!/bin/sh
# Fails if libkvtier.so exports a symbol outside the kvt_ prefix (the version node
# KVTIER_0 aside), or misses the SONAME.
lib="$1"
bad=$(nm -D --defined-only "$lib" | awk '{print $NF}' | grep -v -e '^kvt_' -e '^KVTIER_0$')
if [ -n "$bad" ]; then echo "exported outside kvt_:"; echo "$bad"; exit 1; fi
count=$(nm -D --defined-only "$lib" | grep -c ' kvt_')
[ "$count" -ge 30 ] || { echo "only $count kvt_ symbols exported"; exit 1; }
readelf -d "$lib" | grep -q 'SONAME.*libkvtier.so.0' || { echo "SONAME is not libkvtier.so.0"; exit 1; }
echo "$count kvt_ symbols, nothing else exported, SONAME libkvtier.so.0"
