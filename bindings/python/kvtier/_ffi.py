"""Loads libkvtier through cffi in ABI mode.

The declarations come from include/kvtier.h itself, run through the C preprocessor at import
time (``cc -E -P -DKVT_API=``), so they can never drift from the header. The status codes,
which are #defines and vanish in preprocessing, are read from the header's text.

Where things are found:
  header:  $KVTIER_INCLUDE_DIR/kvtier.h, else the repository's include/ (a checkout), else
           /usr/local/include or /usr/include;
  library: $KVTIER_LIB_DIR/libkvtier.so, else libkvtier.so next to this package, else the
           loader's search path (libkvtier.so.0).
"""
import os
import re
import shutil
import subprocess

import cffi

_HERE = os.path.dirname(os.path.abspath(__file__))


def _find_header():
    candidates = []
    if os.environ.get("KVTIER_INCLUDE_DIR"):
        candidates.append(os.path.join(os.environ["KVTIER_INCLUDE_DIR"], "kvtier.h"))
    candidates += [os.path.join(_HERE, "..", "..", "..", "include", "kvtier.h"),
                   "/usr/local/include/kvtier.h", "/usr/include/kvtier.h"]
    for c in candidates:
        if os.path.exists(c):
            return os.path.abspath(c)
    raise ImportError("kvtier: cannot find kvtier.h; set KVTIER_INCLUDE_DIR")


def _cdef_source(header):
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        raise ImportError("kvtier: a C preprocessor (cc) is needed to read kvtier.h")
    out = subprocess.run([cc, "-E", "-P", "-DKVT_API=", header], capture_output=True,
                         text=True)
    if out.returncode != 0:
        raise ImportError("kvtier: preprocessing %s failed: %s" % (header, out.stderr))
    return out.stdout


def _constants(header):
    text = open(header).read()
    consts = {}
    for name, value in re.findall(r"#define\s+(KVT_\w+)\s+\(?\s*(-?\w+)\s*\)?", text):
        try:
            consts[name] = int(value, 0)
        except ValueError:
            pass
    return consts


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


HEADER = _find_header()
ffi = cffi.FFI()
ffi.cdef(_cdef_source(HEADER))
C = _load_library(ffi)
CONST = _constants(HEADER)
