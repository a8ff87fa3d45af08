"""vLLM's KV-event structs as data, to check what a publisher sends field by field, as
msgspec (not installed here) would decode it into vLLM's classes and stricter: every map
event must be what msgspec's encoder writes.

The structs come from vLLM's own source when VLLM_SRC names a vLLM checkout:
vllm/distributed/kv_events.py (the classes, their msgspec options, their annotated fields
and defaults, the MEDIUM_* names) and vllm/v1/core/kv_cache_utils.py (ExternalBlockHash),
read with `ast`, never imported. Without it, BUILTIN: the same field lists written down
from vLLM main 0231dd5 (tests compare the two when VLLM_SRC is set).
"""
import ast
import os
from pathlib import Path

VLLM_COMMIT = "0231dd5"
EVENT_TAGS = ("BlockStored", "BlockRemoved", "AllBlocksCleared")


class SchemaError(ValueError):
    pass


class Field:
    def __init__(self, name, annotation, has_default=False, default=None):
        self.name, self.annotation = name, annotation
        self.has_default, self.default = has_default, default

    def key(self):
        return (self.name, self.annotation, self.has_default, self.default)


class Struct:
    """A msgspec Struct: its options (array_like, omit_defaults, tag) and fields in order."""

    def __init__(self, name, options, fields):
        self.name, self.options, self.fields = name, dict(options), list(fields)

    def required(self):
        return [f.name for f in self.fields if not f.has_default]

    def key(self):
        return (self.name, sorted(self.options.items()), [f.key() for f in self.fields])


# vLLM main 0231dd5, vllm/distributed/kv_events.py and ExternalBlockHash: the fields each
# class declares (with those it inherits), their annotations and defaults.
_HASH = "list[ExternalBlockHash]"
BUILTIN = {
    "structs": {
        "KVEventBatch": Struct("KVEventBatch", {"array_like": True, "omit_defaults": True}, [
            Field("ts", "float"),
            Field("events", "list[BlockStored | BlockRemoved | AllBlocksCleared]"),
            Field("data_parallel_rank", "int | None", True, None)]),
        "BlockStored": Struct("BlockStored", {"omit_defaults": True, "tag": True}, [
            Field("block_hashes", _HASH),
            Field("parent_block_hash", "ExternalBlockHash | None"),
            Field("token_ids", "list[int]"),
            Field("block_size", "int"),
            Field("lora_id", "int | None"),
            Field("medium", "str | None"),
            Field("lora_name", "str | None"),
            Field("extra_keys", "list[tuple[Any, ...] | None] | None", True, None),
            Field("group_idx", "int | None", True, None),
            Field("kv_cache_spec_kind", "str | None", True, None),
            Field("kv_cache_spec_sliding_window", "int | None", True, None),
            Field("locality", "str | None", True, None)]),
        "BlockRemoved": Struct("BlockRemoved", {"omit_defaults": True, "tag": True}, [
            Field("block_hashes", _HASH),
            Field("medium", "str | None"),
            Field("group_idx", "int | None", True, None),
            Field("locality", "str | None", True, None)]),
        "AllBlocksCleared": Struct("AllBlocksCleared", {"omit_defaults": True, "tag": True}, []),
    },
    "aliases": {"ExternalBlockHash": "bytes | int"},
    "media": ("GPU", "CPU", "FS", "OBJ"),
}

# vLLM 0.10/0.11's array_like events, which kvtier's KVT_KV_EVENTS_FORMAT_ARRAY_V0_11 sends:
# the same leading fields by position, of which these many were required (medium, absent
# before 0.10, may be missing).
ARRAY_V0_11_REQUIRED = {"BlockStored": 5, "BlockRemoved": 1, "AllBlocksCleared": 0}


def _literal(node):
    try:
        return ast.literal_eval(node)
    except ValueError:
        return ast.unparse(node)


def parse_kv_events(source, aliases):
    """The structs, aliases and media of kv_events.py's source text."""
    structs, media = {}, []
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and \
                isinstance(node.targets[0], ast.Name) and node.targets[0].id.startswith("MEDIUM_"):
            media.append(ast.literal_eval(node.value))
        if not isinstance(node, ast.ClassDef):
            continue
        bases = [ast.unparse(b) for b in node.bases]
        parent = next((structs[b] for b in bases if b in structs), None)
        if parent is None and "msgspec.Struct" not in bases:
            continue
        options = dict(parent.options) if parent else {}
        options.update({k.arg: ast.literal_eval(k.value) for k in node.keywords
                        if k.arg in ("array_like", "omit_defaults", "tag")})
        fields = list(parent.fields) if parent else []
        for item in node.body:
            if not (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)):
                continue
            f = Field(item.target.id, ast.unparse(item.annotation), item.value is not None,
                      None if item.value is None else _literal(item.value))
            at = next((i for i, g in enumerate(fields) if g.name == f.name), None)
            if at is None:
                fields.append(f)
            else:  # a subclass narrows a field: it keeps its place (KVEventBatch.events)
                fields[at] = f
        structs[node.name] = Struct(node.name, options, fields)
    return {"structs": structs, "aliases": aliases, "media": tuple(media)}


def parse_aliases(source, names=("ExternalBlockHash",)):
    out = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and \
                node.target.id in names and node.value is not None:
            out[node.target.id] = ast.unparse(node.value)
    return out


class Schema:
    """Checks decoded msgpack values against the structs. source says where they came from."""

    def __init__(self, data, source):
        self.structs, self.aliases, self.media = data["structs"], data["aliases"], data["media"]
        self.source = source
        self._checkers = {}  # annotation -> its compiled check
        for name in ("KVEventBatch",) + EVENT_TAGS:
            if name not in self.structs:
                raise SchemaError(f"{source}: no class {name}")

    @classmethod
    def load(cls, vllm_src=None):
        """From vllm_src (default $VLLM_SRC), else BUILTIN."""
        vllm_src = vllm_src if vllm_src is not None else os.environ.get("VLLM_SRC")
        if not vllm_src:
            return cls(BUILTIN, f"the built-in copy of vLLM {VLLM_COMMIT}'s structs "
                                "(VLLM_SRC is not set)")
        root = Path(vllm_src)
        events = root / "vllm" / "distributed" / "kv_events.py"
        utils = root / "vllm" / "v1" / "core" / "kv_cache_utils.py"
        aliases = parse_aliases(utils.read_text())
        return cls(parse_kv_events(events.read_text(), aliases), str(events))

    # ---- types

    def check_type(self, value, annotation, where):
        check = self._checkers.get(annotation)
        if check is None:
            check = self._checkers[annotation] = self._compile(
                ast.parse(annotation, mode="eval").body, annotation)
        check(value, where)

    _SCALARS = {"Any": lambda v: True,
                "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
                "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
                "str": lambda v: isinstance(v, str),
                "bytes": lambda v: isinstance(v, bytes),
                "bool": lambda v: isinstance(v, bool)}

    @staticmethod
    def _fail(v, where, text):
        shown = repr(v)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        raise SchemaError(f"{where}: {shown} is not {text}")

    def _compile(self, node, text):
        """A function (value, where) that raises SchemaError unless value is of the
        annotation node, as msgpack decodes it (arrays as lists): compiled once per
        annotation, since a batch holds thousands of token ids."""
        fail = self._fail
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
            sides = [self._compile(n, ast.unparse(n)) for n in (node.left, node.right)]

            def union(v, where):
                for side in sides:
                    try:
                        return side(v, where)
                    except SchemaError:
                        pass
                fail(v, where, text)
            return union
        if isinstance(node, ast.Constant) and node.value is None:
            return lambda v, where: v is None or fail(v, where, text)
        if isinstance(node, ast.Name):
            name = node.id
            if name in self.aliases:
                return self._compile(ast.parse(self.aliases[name], mode="eval").body,
                                     f"{name} ({self.aliases[name]})")
            if name in EVENT_TAGS:  # a tagged event map (its fields are checked apart)
                return lambda v, where: (isinstance(v, dict) and v.get("type") == name) or \
                    fail(v, where, text)
            ok = self._SCALARS.get(name)
            if ok is None:
                raise SchemaError(f"cannot check the annotation {text}")
            return lambda v, where: ok(v) or fail(v, where, text)
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and \
                node.value.id in ("list", "tuple"):
            args = node.slice
            items = list(args.elts) if isinstance(args, ast.Tuple) else [args]
            variadic = node.value.id == "list" or (
                len(items) == 2 and isinstance(items[1], ast.Constant) and
                items[1].value is Ellipsis)
            if variadic:
                item = self._compile(items[0], ast.unparse(items[0]))
                scalar = isinstance(items[0], ast.Name) and self._SCALARS.get(items[0].id)

                def sequence(v, where):
                    if not isinstance(v, list):
                        fail(v, where, text)
                    if scalar and all(map(scalar, v)):  # the common case, at C speed
                        return
                    for i, x in enumerate(v):
                        item(x, f"{where}[{i}]")
                return sequence
            fixed = [self._compile(n, ast.unparse(n)) for n in items]

            def record(v, where):
                if not isinstance(v, list) or len(v) != len(fixed):
                    fail(v, where, text)
                for i, (x, check) in enumerate(zip(v, fixed)):
                    check(x, f"{where}[{i}]")
            return record
        raise SchemaError(f"cannot check the annotation {text}")

    # ---- structs

    def check_event_map(self, obj, where="event"):
        """A tagged event map exactly as msgspec encodes it (tag=True, omit_defaults=True):
        "type" first, then the fields in declaration order, every field without a default,
        those with one only when not equal to it, no other key, each of its type. Returns
        {"type": tag, field: value} with every field (defaults filled in)."""
        if not isinstance(obj, dict):
            raise SchemaError(f"{where}: expected a map")
        keys = list(obj)
        if not keys or keys[0] != "type" or not isinstance(obj["type"], str):
            raise SchemaError(f"{where}: a map event starts with its tag, a str under 'type'")
        tag = obj["type"]
        if tag not in EVENT_TAGS:
            raise SchemaError(f"{where}: unknown tag {tag[:64]!r}")
        st = self.structs[tag]
        names = [f.name for f in st.fields]
        unknown = [k for k in keys[1:] if k not in names]
        if unknown:
            raise SchemaError(f"{where}: {tag} has no field {str(unknown[0])[:64]!r}")
        order = [n for n in names if n in obj]
        if keys[1:] != order:
            raise SchemaError(f"{where}: {tag}'s fields out of declaration order: {keys[1:]}")
        out = {"type": tag}
        for f in st.fields:
            if f.name not in obj:
                if not f.has_default:
                    raise SchemaError(f"{where}: {tag} lacks {f.name!r}, which has no default")
                out[f.name] = f.default
                continue
            v = obj[f.name]
            if f.has_default and st.options.get("omit_defaults") and v == f.default:
                raise SchemaError(f"{where}.{f.name}: equal to its default {f.default!r}, "
                                  "which omit_defaults leaves out")
            self.check_type(v, f.annotation, f"{where}.{f.name}")
            out[f.name] = v
        return out

    def check_event_array(self, obj, where="event"):
        """A tagged array event of vLLM 0.10/0.11 (array_like): the tag, then the fields by
        position; extra trailing elements are ignored, as msgspec does."""
        if not isinstance(obj, list) or not obj or not isinstance(obj[0], str):
            raise SchemaError(f"{where}: an array event starts with its tag (a str)")
        tag = obj[0]
        if tag not in EVENT_TAGS:
            raise SchemaError(f"{where}: unknown tag {tag[:64]!r}")
        st, values = self.structs[tag], obj[1:]
        need = ARRAY_V0_11_REQUIRED[tag]
        if len(values) < need:
            raise SchemaError(f"{where}: {tag} needs at least {need} fields, got {len(values)}")
        out = {"type": tag}
        for i, f in enumerate(st.fields):
            if i < len(values):
                self.check_type(values[i], f.annotation, f"{where}.{f.name}")
                out[f.name] = values[i]
            else:
                out[f.name] = f.default
        return out

    def check_batch(self, obj):
        """KVEventBatch: [ts, events] or [ts, events, data_parallel_rank] (array_like with
        omit_defaults drops a trailing None), or a map of those. Returns (ts, [raw events],
        data_parallel_rank); the events are checked one by one by the caller."""
        st = self.structs["KVEventBatch"]
        names = [f.name for f in st.fields]
        if isinstance(obj, list):
            if not 2 <= len(obj) <= len(names):
                raise SchemaError(f"batch: expected {names}, got {len(obj)} elements")
            if len(obj) == 3 and obj[2] is None and st.options.get("omit_defaults"):
                raise SchemaError("batch: a trailing data_parallel_rank None, which "
                                  "omit_defaults leaves out")
            values = dict(zip(names, obj))
        elif isinstance(obj, dict):
            values = obj
            if "ts" not in obj or "events" not in obj:
                raise SchemaError("batch: a map batch needs 'ts' and 'events'")
        else:
            raise SchemaError("batch: expected an array or a map")
        if not isinstance(values["events"], list):
            raise SchemaError("batch.events: expected a list")
        for f in st.fields:
            if f.name != "events" and f.name in values:
                self.check_type(values[f.name], f.annotation, f"batch.{f.name}")
        return values["ts"], values["events"], values.get("data_parallel_rank")
