"""Loads libkvtier through cffi in ABI mode: no C compiler, at import or ever.

The declarations (_cdef.py) are generated from include/kvtier.h by bindings/python/gen_cdef.py
and shipped with the package; a test regenerates them and fails if they went stale.

The library: $KVTIER_LIB_DIR/libkvtier.so, else libkvtier.so next to this package, else the
libdir of pkg-config's kvtier.pc (an installed kvtier, or a build tree on PKG_CONFIG_PATH),
else the loader's search path (libkvtier.so.0).
"""
import os
import shutil
import subprocess

import cffi

from ._cdef import CDEF, CONST  # noqa: F401 (CONST is for the package)

_HERE = os.path.dirname(os.path.abspath(__file__))


def _pkg_config_libdir():
    """kvtier.pc's libdir, or None (no pkg-config, no kvtier.pc)."""
    if shutil.which("pkg-config") is None:
        return None
    try:
        r = subprocess.run(["pkg-config", "--variable=libdir", "kvtier"], capture_output=True,
                           text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if r.returncode != 0 or not r.stdout.strip():
        return None
    return r.stdout.strip()


def _candidates():
    if os.environ.get("KVTIER_LIB_DIR"):
        yield os.path.join(os.environ["KVTIER_LIB_DIR"], "libkvtier.so")
    yield os.path.join(_HERE, "libkvtier.so")
    libdir = _pkg_config_libdir()
    if libdir:
        yield os.path.join(libdir, "libkvtier.so.0")
    yield "libkvtier.so.0"


def _load_library(ffi):
    errors = []
    for n in _candidates():
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
