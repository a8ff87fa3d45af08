"""Block hashes (chained xxh3-64, as NVIDIA Dynamo's KVBM): all at once, or incrementally."""
from typing import List, Tuple, Union

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
    blocks = ffi.new("size_t *")
    cap = n // page_size if page_size > 0 else 0  # the full blocks: one call, not a count first
    out = ffi.new("uint64_t[]", max(cap, 1))
    _check(C.kvt_hash_tokens(out, cap, blocks, _salt_hash(salt), toks, n, page_size))
    return _to_list(out, min(blocks[0], cap))


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

    def info(self) -> Tuple[int, int]:
        """(tokens appended so far, full blocks hashed so far)."""
        t, b = ffi.new("size_t *"), ffi.new("size_t *")
        with self._using() as s:
            _check(C.kvt_seq_info(t, b, s))
        return t[0], b[0]

    def hashes(self, first: int = 0) -> List[int]:
        """The sequence hashes of the complete blocks from block `first` on."""
        n = ffi.new("size_t *")
        with self._using() as s:
            _check(C.kvt_seq_copy_hashes(ffi.NULL, ffi.NULL, 0, n, s, first))  # how many
            out = ffi.new("uint64_t[]", max(n[0], 1))
            _check(C.kvt_seq_copy_hashes(ffi.NULL, out, n[0], n, s, first))
        return _to_list(out, n[0])
