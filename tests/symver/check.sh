#!/bin/sh
# Symbol versions (src/kvtier.map): a program that uses a call of the newest node runs with
# today's library and fails at load, naming the node, with a copy linked without that node;
# a program of the older nodes' calls runs with both.
#   check.sh NEWEST_NODE TODAY_DIR PREVIOUS_DIR PROBE_NEWEST PROBE_OLDER
node="$1" today="$2" prev="$3" newest="$4" older="$5"
fail() { echo "FAIL: $*"; exit 1; }
out=$(LD_LIBRARY_PATH="$today" "$newest" 2>&1) || fail "with today's library: $out"
echo "today's library: $out"
objdump -T "$today/libkvtier.so.0" | grep -q " $node " || fail "no call of the library is in $node"
objdump -T "$prev/libkvtier.so.0" | grep -q " $node " && fail "the previous copy has $node"
if out=$(LD_LIBRARY_PATH="$prev" "$newest" 2>&1); then fail "it started without $node: $out"; fi
echo "$out" | grep -q "version \`$node' not found" || fail "the loader said: $out"
echo "without $node: $out"
out=$(LD_LIBRARY_PATH="$prev" "$older" 2>&1) || fail "older calls without $node: $out"
echo "older calls, without $node: $out"
