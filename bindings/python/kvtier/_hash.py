"""Block hashes (chained xxh3-64, as NVIDIA Dynamo's KVBM): all at once, or incrementally."""
from typing import List, Union

from ._errors import InvalidHandleError, _check
from ._ffi import C, ffi
from ._util import _Handle, _to_list, _u32_array

Salt = Union[bytes, str, int]  # a salt, or its hash from hash_salt


def hash_salt(salt: Union[bytes, str] = b"") -> int:
    """The salt's hash: what the other calls take (and what a connector's salt_hash is)."""
    if isinstance(salt, str):
        salt = salt.encode()
    out = ffi.new("uint64_t *")
    _check(C.kvt_hash_salt(out, salt, len(salt)))
    return out[0]


def _salt_hash(salt: Salt) -> int:
    return salt if isinstance(salt, int) else hash_salt(salt)


def hash_sequence(tokens, page_size: int, salt: Salt = b"") -> List[int]:
    """Sequence hashes of the full blocks of tokens, as a list."""
    toks, n = _u32_array(tokens)
    need = ffi.new("size_t *")
    cap = n // page_size if page_size > 0 else 0
    out = ffi.new("uint64_t[]", max(cap, 1))
    _check(C.kvt_hash_sequence(out, need, cap, _salt_hash(salt), toks, n, page_size))
    return _to_list(out, need[0])


class Seq(_Handle):
    """Incremental hasher: append tokens in any split; hashes() equals hash_sequence. One
    thread at a time."""
    _closed_error = InvalidHandleError
    _closed_message = "kvt_seq is closed"

    def __init__(self, page_size: int, salt: Salt = b""):
        out = ffi.new("kvt_seq **")
        _check(C.kvt_seq_create(out, _salt_hash(salt), page_size))
        self._own(out[0])

    def _free(self, s) -> None:
        C.kvt_seq_destroy(s)

    def append(self, tokens) -> None:
        toks, n = _u32_array(tokens)
        with self._using() as s:
            _check(C.kvt_seq_append(s, toks, n))

    def hashes(self, first: int = 0) -> List[int]:
        """The sequence hashes of the complete blocks from block `first` on."""
        with self._using() as s:
            t, b = ffi.new("size_t *"), ffi.new("size_t *")
            _check(C.kvt_seq_info(t, b, s))
            n = max(b[0] - first, 0)
            out, got = ffi.new("uint64_t[]", max(n, 1)), ffi.new("size_t *")
            _check(C.kvt_seq_hashes(got, ffi.NULL, out, s, first, n))
        return _to_list(out, got[0])
