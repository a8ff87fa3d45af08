"""Loads libkvtier through cffi in ABI mode: no C compiler, at import or ever.

The declarations (_cdef.py) are generated from include/kvtier.h by bindings/python/gen_cdef.py
and shipped with the package; a test regenerates them and fails if they went stale.

The library: $KVTIER_LIB_DIR/libkvtier.so, else libkvtier.so next to this package, else the
loader's search path (libkvtier.so.0).
"""
import os

import cffi

from ._cdef import CDEF, CONST  # noqa: F401 (CONST is for the package)

_HERE = os.path.dirname(os.path.abspath(__file__))


def _load_library(ffi):
    names = []
    if os.environ.get("KVTIER_LIB_DIR"):
        names.append(os.path.join(os.environ["KVTIER_LIB_DIR"], "libkvtier.so"))
    names += [os.path.join(_HERE, "libkvtier.so"), "libkvtier.so.0"]
    errors = []
    for n in names:
        if os.path.sep in n and not os.path.exists(n):
            continue
        try:
            return ffi.dlopen(n)
        except OSError as e:
            errors.append(str(e))
    raise ImportError("kvtier: cannot load libkvtier (set KVTIER_LIB_DIR): " + "; ".join(errors))


ffi = cffi.FFI()
ffi.cdef(CDEF)
C = _load_library(ffi)
