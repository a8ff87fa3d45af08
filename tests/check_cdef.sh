#!/bin/sh
# The Python binding ships its cffi declarations (bindings/python/kvtier/_cdef.py): they must
# be what gen_cdef.py makes of today's header, and must parse with cffi.
exec /usr/bin/python3 "$1/bindings/python/gen_cdef.py" --check
