#!/bin/sh
# The header, preprocessed as bindings do (cc -E -P -DKVT_API=), must parse with cffi's cdef.
set -e
src="$1"
out=$(mktemp)
cc -E -P -DKVT_API= "$src/include/kvtier.h" > "$out"
/usr/bin/python3 - "$out" <<'PY'
import sys, cffi
ffi = cffi.FFI()
ffi.cdef(open(sys.argv[1]).read())
print("cffi parsed the header:", len(dir(ffi)), "attributes")
PY
rm -f "$out"
