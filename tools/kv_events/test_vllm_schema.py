"""vllm_schema.py: its reading of vLLM's kv_events.py with `ast`, and its built-in copy
against vLLM's source when VLLM_SRC names a checkout (skipped, saying so, without it)."""
import os
from pathlib import Path

import pytest

import vllm_schema as vs

VLLM_SRC = os.environ.get("VLLM_SRC")
needs_vllm = pytest.mark.skipif(
    not VLLM_SRC, reason="VLLM_SRC is not set: vLLM's kv_events.py not compared (tools/test.sh "
                         "sets it to ../shared/vllm when that exists)")

# A kv_events.py of the same shape as vLLM's: a batch base class narrowed by a subclass,
# tagged events inheriting their options, defaults, and classes that are no Struct.
SAMPLE = '''
import msgspec
MEDIUM_GPU = "GPU"
MEDIUM_X = "X"
class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    rank: int | None = None
class Base(msgspec.Struct, omit_defaults=True, tag=True):
    """doc"""
class Stored(Base):
    hashes: list[ExternalBlockHash]
    size: int
    kind: str | None = "full"
    def __hash__(self): return 0
class Batch(EventBatch):
    events: list[Stored]
class Helper:
    x: int
'''


def test_reads_classes_options_fields_and_media():
    got = vs.parse_kv_events(SAMPLE, {"ExternalBlockHash": "bytes | int"})
    s = got["structs"]
    assert set(s) == {"EventBatch", "Base", "Stored", "Batch"}
    assert s["Stored"].options == {"omit_defaults": True, "tag": True}
    assert [(f.name, f.annotation, f.has_default, f.default) for f in s["Stored"].fields] == [
        ("hashes", "list[ExternalBlockHash]", False, None), ("size", "int", False, None),
        ("kind", "str | None", True, "full")]
    assert s["Batch"].options == {"array_like": True, "omit_defaults": True}
    assert [f.annotation for f in s["Batch"].fields] == ["float", "list[Stored]", "int | None"]
    assert got["media"] == ("GPU", "X")


def test_types_as_annotated():
    schema = vs.Schema(vs.BUILTIN, "builtin")
    ok = [(5, "int"), (None, "int | None"), (b"\x01", "ExternalBlockHash"), (2.5, "float"),
          ([1, b"x"], "list[ExternalBlockHash]"), (["a", 1], "tuple[str, int]"),
          ([["a", 1], None], "list[tuple[Any, ...] | None]")]
    for value, annotation in ok:
        schema.check_type(value, annotation, "v")
    bad = [(True, "int"), ("5", "int"), (None, "int"), ([1.5], "list[int]"),
           ("x", "list[int]"), (["a"], "tuple[str, int]"), (1.5, "ExternalBlockHash")]
    for value, annotation in bad:
        with pytest.raises(vs.SchemaError):
            schema.check_type(value, annotation, "v")
    with pytest.raises(vs.SchemaError, match="cannot check"):
        schema.check_type(1, "dict[str, int]", "v")


def test_without_vllm_src_the_builtin_copy_says_so(monkeypatch):
    monkeypatch.delenv("VLLM_SRC", raising=False)
    schema = vs.Schema.load()
    assert "built-in" in schema.source and vs.VLLM_COMMIT in schema.source


@needs_vllm
def test_builtin_copy_equals_vllm_source():
    schema = vs.Schema.load(VLLM_SRC)
    assert schema.source.endswith(str(Path("vllm", "distributed", "kv_events.py")))
    for name, want in vs.BUILTIN["structs"].items():
        assert schema.structs[name].key() == want.key(), name
    assert schema.aliases == vs.BUILTIN["aliases"]
    assert schema.media == vs.BUILTIN["media"]
