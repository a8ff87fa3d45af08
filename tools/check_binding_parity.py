#!/usr/bin/python3
"""Fails when a binding leaves an exported call or a config field out (docs/CONVENTIONS.md).

Every KVT_API call of include/kvtier.h that is not a deprecated alias, and every field of the
config structs a caller fills, must be named in each binding's own sources: Python's
kvtier/ package (its generated cdef aside), Rust's safe crate (bindings/rust/kvtier/src) and
Go's package (bindings/go, tests aside), as a word: a C call by its name, a field by its C
name (a binding that sets fields generically, by reflection, still names each one in a typed
config so that callers and this check can see it).

  tools/check_binding_parity.py            exit 1 and a list when one is missing
  tools/check_binding_parity.py --list     the calls and fields checked
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
HEADER = ROOT / "include" / "kvtier.h"

BINDINGS = {
    "python": (ROOT / "bindings/python/kvtier", "*.py", ("_cdef.py",)),
    "rust": (ROOT / "bindings/rust/kvtier/src", "*.rs", ()),
    "go": (ROOT / "bindings/go", "*.go", ("_test.go",)),
}

# The config structs whose every field a binding must let its caller set.
CONFIG_STRUCTS = ("kvt_manager_config", "kvt_connector_config", "kvt_endpoint_config")
# Fields no caller sets: the struct's size is the binding's to fill, reserved* must stay 0.
NOT_SET_BY_CALLERS = {"struct_size", "reserved"}


def calls(header):
    """The exported calls, without the deprecated aliases."""
    out = []
    deprecated_next = False
    for line in header.splitlines():
        if line.startswith("KVT_DEPRECATED("):
            deprecated_next = True
            continue
        m = re.match(r"KVT_API\b.*?\b(kvt_[a-z0-9_]+)\(", line)
        if m:
            if not deprecated_next:
                out.append(m.group(1))
            deprecated_next = False
    return sorted(set(out))


def fields(header, struct):
    body = re.search(r"typedef struct %s \{(.*?)\} %s;" % (struct, struct), header, re.S)
    if not body:
        sys.exit(f"check_binding_parity: struct {struct} not found in {HEADER}")
    text = re.sub(r"/\*.*?\*/", "", body.group(1), flags=re.S)
    names = re.findall(r"\b([a-z_][a-z0-9_]*)\s*(?:\[[^\]]*\])?\s*;", text)
    return [n for n in names if re.sub(r"\d+$", "", n) not in NOT_SET_BY_CALLERS]


def sources(directory, pattern, skip):
    text = []
    for path in sorted(directory.rglob(pattern)):
        if any(path.name.endswith(s) for s in skip) or "target" in path.parts:
            continue
        text.append(path.read_text())
    return "\n".join(text)


def main():
    header = HEADER.read_text()
    want_calls = calls(header)
    want_fields = {s: fields(header, s) for s in CONFIG_STRUCTS}
    if "--list" in sys.argv[1:]:
        print("\n".join(want_calls))
        for s, names in want_fields.items():
            print(f"{s}: {' '.join(names)}")
        return 0
    missing = 0
    for name, (directory, pattern, skip) in BINDINGS.items():
        text = sources(directory, pattern, skip)
        words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", text))
        lost_calls = [c for c in want_calls if c not in words]
        lost_fields = [f"{s}.{f}" for s, names in want_fields.items() for f in names
                       if f not in words]
        for what, lost in (("calls", lost_calls), ("config fields", lost_fields)):
            if lost:
                missing += len(lost)
                print(f"{name}: {len(lost)} {what} not reachable: {' '.join(lost)}")
    total = len(want_calls) + sum(len(v) for v in want_fields.values())
    if missing:
        print(f"check_binding_parity: {missing} gaps (each binding must reach {total} names)")
        return 1
    print(f"check_binding_parity: {len(want_calls)} calls and "
          f"{total - len(want_calls)} config fields reachable from Python, Rust and Go")
    return 0


if __name__ == "__main__":
    sys.exit(main())
