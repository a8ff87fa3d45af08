"""vLLM's own code driving kvtier.vllm: vLLM's pure-Python parts loaded from VLLM_SRC (a
checkout of vLLM's source, e.g. ../shared/vllm), stubs for what they import but this test
does not exercise, and stand-ins for the parts of vLLM that cannot be imported here (no
torch, numpy, pydantic 2 or msgspec): the GPU block pool, the KV-cache coordinator, the
request queue and a model runner whose "forward" writes known bytes into host KV caches.

Real vLLM (imported from VLLM_SRC): KVConnectorFactory (factory.py), KVConnectorBase_V1
(v1/base.py), SchedulerOutput/NewRequestData/CachedRequestData (sched/output.py),
ModelRunnerOutput/KVConnectorOutput (v1/outputs.py), Request/RequestStatus (v1/request.py),
KVTransferConfig/KVEventsConfig, KVCacheConfig and the specs (v1/kv_cache_interface.py),
BlockStored/BlockRemoved/KVEventBatch (distributed/kv_events.py), sha256 (utils/hashing.py).

vLLM compiled from its source file by file, function by function (compile_functions,
compile_class; line numbers kept, so a vLLM assert points at vLLM's line): Scheduler (all of
schedule, update_from_output and the KV-connector paths, __init__ included) and
AsyncScheduler; KVCacheManager and SingleTypeKVCacheManager/FullAttentionManager;
hash_block_tokens, get_request_block_hasher, init_none_hash, maybe_convert_block_hash,
KVCacheBlock, FreeKVCacheBlockQueue (kv_cache_utils.py); FlashAttentionBackend's
get_kv_cache_shape and get_kv_cache_stride_order; KVConnectorModelRunnerMixin's connector
context (kv_connector_model_runner_mixin.py); maybe_transfer_kv_layer (kv_transfer_utils.py);
KVOutputAggregator (kv_connector/utils.py), which merges N workers' KVConnectorOutputs; the
VllmConfig properties the scheduler reads; ConstantList.

Stand-ins (documented where defined): BlockPool, the unitary KV-cache coordinator, the FCFS
request queue, check_stop, the engine core loop (EngineCore.step and step_with_batch_queue),
the worker (Worker: GPUModelRunner's connector order, _update_states' bookkeeping, a
deterministic "model" with speculative decoding), and, for tensor/pipeline parallel, the
multiproc executor (WorkerGroup: one spawned process per rank, each a Worker over its shard
of the KV caches, bytes only between them and the scheduler).
"""
import ast
import contextlib
import copy
import ctypes
import dataclasses
import enum
import hashlib
import importlib
import logging
import math
import os
import pickle
import sys
import threading
import time
import types
import typing
from collections import defaultdict, deque

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

STUB = "Stub (kvtier's vLLM test harness): "


class HarnessError(AssertionError):
    """The harness itself is inconsistent (not a kvtier bug)."""


# ---------------------------------------------------------------------------------------
# Loading single functions and classes from vLLM's files
# ---------------------------------------------------------------------------------------

def _tree(path):
    with open(path) as f:
        return ast.parse(f.read(), filename=path)


_KEEP_DECORATORS = {"staticmethod", "classmethod", "property", "contextmanager",
                    "setter", "cached_property", "wraps"}


def _decorator_name(d):
    while isinstance(d, ast.Call):
        d = d.func
    if isinstance(d, ast.Attribute):
        return d.attr
    return d.id if isinstance(d, ast.Name) else None


def compile_functions(path, names, namespace):
    """Compiles the named top-level functions, classes and constants of a vLLM file into namespace
    (their globals) and returns them by name; decorators other than the builtin ones are
    kept (they must be in namespace)."""
    nodes = {}
    for n in _tree(path).body:
        if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name in names:
            nodes[n.name] = n
        elif isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(
                n.targets[0], ast.Name) and n.targets[0].id in names:
            nodes[n.targets[0].id] = n  # a module-level constant
    missing = set(names) - set(nodes)
    if missing:
        raise HarnessError("%s has no %s" % (path, sorted(missing)))
    mod = ast.Module(body=[nodes[n] for n in names], type_ignores=[])
    exec(compile(mod, path, "exec"), namespace)
    return {n: namespace[n] for n in names}


def compile_class(path, class_name, methods, namespace, bases=(), name=None, attrs=None):
    """A class named `name` (default class_name) with the given bases, whose methods are
    vLLM's own `methods` of class_name in path (all definitions of each, so @overload stubs
    are followed by the real one), compiled with namespace as globals. Inside them super()
    and __class__ work. Decorators other than staticmethod/classmethod/property/
    contextmanager (e.g. @abstractmethod, @overload) are dropped."""
    cls_node = next((n for n in _tree(path).body
                     if isinstance(n, ast.ClassDef) and n.name == class_name), None)
    if cls_node is None:
        raise HarnessError("%s has no class %s" % (path, class_name))
    body = []
    for n in cls_node.body:
        if isinstance(n, ast.FunctionDef) and n.name in methods:
            n.decorator_list = [d for d in n.decorator_list
                                if _decorator_name(d) in _KEEP_DECORATORS]
            body.append(n)
    missing = set(methods) - {n.name for n in body}
    if missing:
        raise HarnessError("%s: %s has no %s" % (path, class_name, sorted(missing)))
    base_names = []
    for i, b in enumerate(bases):
        namespace["__harness_base%d" % i] = b
        base_names.append(ast.Name(id="__harness_base%d" % i, ctx=ast.Load()))
    new = ast.ClassDef(name=name or class_name, bases=base_names, keywords=[], body=body,
                       decorator_list=[])
    ast.copy_location(new, cls_node)
    mod = ast.Module(body=[new], type_ignores=[])
    ast.fix_missing_locations(mod)
    exec(compile(mod, path, "exec"), namespace)
    cls = namespace[name or class_name]
    for k, v in (attrs or {}).items():
        setattr(cls, k, v)
    return cls


class Unavailable:
    """What a vLLM file imports that this harness neither loads nor stubs: any use fails,
    naming it (so a code path the harness did not plan for cannot pass silently)."""

    def __init__(self, name):
        self._name = name

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        raise HarnessError("vLLM code used %s.%s, which the harness does not provide"
                           % (self._name, attr))

    def __call__(self, *a, **k):
        raise HarnessError("vLLM code called %s, which the harness does not provide"
                           % self._name)

    def __repr__(self):
        return "<unavailable %s>" % self._name

    # usable in annotations, which vLLM's files evaluate at definition time
    def __or__(self, other):
        return typing.Any

    __ror__ = __or__

    def __getitem__(self, item):
        return typing.Any


def import_namespace(path, module_name, doc=None):
    """The globals a vLLM file would have after its top-level imports: each import statement
    run on its own; names that cannot be imported are Unavailable. They are the __dict__ of
    a module registered as module_name (dataclasses look their module up), which holds only
    what is then compiled into it."""
    mod = types.ModuleType(module_name, STUB + (doc or "holds only functions and classes "
                           "compiled from vLLM's %s" % os.path.basename(path)))
    sys.modules.setdefault(module_name, mod)
    ns = sys.modules[module_name].__dict__
    ns.update({"__file__": path})
    for node in _tree(path).body:
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            continue
        for alias in node.names:
            bind = alias.asname or alias.name.split(".")[0]
            single = copy.copy(node)
            single.names = [alias]
            try:
                exec(compile(ast.Module(body=[single], type_ignores=[]), path, "exec"), ns)
            except Exception:  # noqa: BLE001 - any import failure makes the name unavailable
                ns[bind] = Unavailable(alias.name if isinstance(node, ast.Import)
                                       else "%s.%s" % (node.module, alias.name))
    return ns


# ---------------------------------------------------------------------------------------
# Stubs: what vLLM's files import that the code under test does not use
# ---------------------------------------------------------------------------------------

def _module(name, doc, package_dir=None, **attrs):
    m = types.ModuleType(name, STUB + doc)
    if package_dir is not None:
        m.__path__ = [package_dir]
    for k, v in attrs.items():
        if isinstance(v, type) and v.__module__ == __name__:
            v.__module__ = name  # so pickle finds the class where vLLM's code imports it
        setattr(m, k, v)
    sys.modules[name] = m
    parent, _, child = name.rpartition(".")
    if parent in sys.modules:
        setattr(sys.modules[parent], child, m)
    return m


class _Logger(logging.Logger):
    """Stub of vllm.logger's logger: the *_once variants log every time."""

    def debug_once(self, msg, *a, **k):
        self.debug(msg, *a)

    def info_once(self, msg, *a, **k):
        self.info(msg, *a)

    def warning_once(self, msg, *a, **k):
        self.warning(msg, *a)


def init_logger(name):
    """Stub of vllm.logger.init_logger."""
    log = _Logger(name)
    log.parent = logging.getLogger("vllm")
    return log


class TensorStub:
    """Stub of torch.Tensor as a type (annotations, isinstance); tensors here are KVTensor."""


class DtypeStub:
    """Stub of a torch.dtype."""

    def __init__(self, name, itemsize):
        self.name, self.itemsize = name, itemsize

    def __repr__(self):
        return "torch." + self.name


def _install_third_party_stubs():
    try:
        import torch  # noqa: F401
    except ImportError:
        _module("torch", "torch.Tensor and dtypes as names only; no tensor maths is used",
                Tensor=TensorStub, dtype=DtypeStub, float16=DtypeStub("float16", 2),
                bfloat16=DtypeStub("bfloat16", 2), float32=DtypeStub("float32", 4),
                int8=DtypeStub("int8", 1), uint8=DtypeStub("uint8", 1),
                int32=DtypeStub("int32", 4), device=object,
                inference_mode=lambda *a, **k: (lambda f: f))
    try:
        import numpy  # noqa: F401
    except ImportError:
        class ndarray:
            """Stub of numpy.ndarray as a type name."""
        _module("numpy", "numpy.ndarray as a type name only", ndarray=ndarray)
        _module("numpy.typing", "numpy.typing as a name only", NDArray=typing.Any)
    try:
        import typing_extensions  # noqa: F401
    except ImportError:
        _module("typing_extensions", "the names vLLM's files take from it, from typing",
                ParamSpec=typing.ParamSpec, Self=typing.Self, TypeIs=typing.Any,
                deprecated=lambda *a, **k: (lambda f: f), override=lambda f: f)
    try:
        import cbor2  # noqa: F401
    except ImportError:
        _module("cbor2", "hashing.py imports it for the *_cbor hashes; the default "
                "prefix-caching hash (sha256, pickle) does not use it",
                dumps=Unavailable("cbor2.dumps"))
    try:
        import msgspec  # noqa: F401
    except ImportError:
        _module("msgspec", "msgspec.Struct stand-in (below); no msgspec encoding is used",
                Struct=Struct, msgpack=types.SimpleNamespace(Encoder=Unavailable(
                    "msgspec.msgpack.Encoder"), Decoder=Unavailable("msgspec.msgpack.Decoder")))


class Struct:
    """Stand-in of msgspec.Struct: accepts the class keywords (array_like, omit_defaults,
    gc, tag, ...), collects the annotated fields of the class and its bases in order, and
    builds a keyword (or positional) constructor with the declared defaults; equality and
    repr field by field, as msgspec's."""

    __struct_fields__ = ()
    __struct_defaults__ = {}

    def __init_subclass__(cls, **options):
        super().__init_subclass__()
        cls.__struct_config__ = dict(getattr(cls, "__struct_config__", {}), **options)
        fields, defaults = list(cls.__struct_fields__), dict(cls.__struct_defaults__)
        for k in cls.__dict__.get("__annotations__", {}):
            if k.startswith("__") or k in fields:
                continue
            fields.append(k)
            if k in cls.__dict__:
                defaults[k] = cls.__dict__[k]
        cls.__struct_fields__, cls.__struct_defaults__ = tuple(fields), defaults

    def __init__(self, *args, **kwargs):
        fields = self.__struct_fields__
        if len(args) > len(fields):
            raise TypeError("%s: too many positional arguments" % type(self).__name__)
        values = dict(zip(fields, args))
        for k, v in kwargs.items():
            if k not in fields:
                raise TypeError("%s has no field %r" % (type(self).__name__, k))
            if k in values:
                raise TypeError("%s: %r given twice" % (type(self).__name__, k))
            values[k] = v
        for k in fields:
            if k not in values:
                if k not in self.__struct_defaults__:
                    raise TypeError("%s missing required argument %r" % (type(self).__name__, k))
                values[k] = copy.copy(self.__struct_defaults__[k])
            setattr(self, k, values[k])

    def __eq__(self, other):
        return type(self) is type(other) and all(
            getattr(self, k) == getattr(other, k) for k in self.__struct_fields__)

    def __repr__(self):
        return "%s(%s)" % (type(self).__name__, ", ".join(
            "%s=%r" % (k, getattr(self, k)) for k in self.__struct_fields__))


# vllm.* stubs: each a name the real files import at module level and the tested paths
# reach only as a value or a no-op.

class VllmConfigStub:
    """Stub of vllm.config.VllmConfig as a type name (the config object is VllmConfig
    below)."""


def _config_decorator(cls=None, **kwargs):
    """Stub of vllm.config.utils.config: a plain dataclass instead of pydantic's."""
    if cls is None:
        return lambda c: dataclasses.dataclass(c)
    return dataclasses.dataclass(cls)


def cdiv(a, b):
    """Stub of vllm.utils.math_utils.cdiv."""
    return -(a // -b)


def round_up(x, y):
    """Stub of vllm.utils.math_utils.round_up."""
    return cdiv(x, y) * y


def get_dtype_size(dtype):
    """Stub of vllm.utils.torch_utils.get_dtype_size."""
    return dtype.itemsize


class CUDAGraphStat:
    """Stub of vllm.compilation.cuda_graph.CUDAGraphStat (never produced here)."""


class AttentionBackend:
    """Stub of vllm.v1.attention.backend.AttentionBackend as a type name."""


class AttentionMetadata:
    """Stub of vllm.v1.attention.backend.AttentionMetadata: the forward's per-step
    metadata, here the step's scheduled requests (only checked for None by
    maybe_transfer_kv_layer)."""

    def __init__(self, step):
        self.step = step


class MambaAttentionBackendEnum(enum.Enum):
    """Stub of vllm.v1.attention.backends.registry.MambaAttentionBackendEnum."""
    MAMBA1 = 1
    MAMBA2 = 2


class KVCacheSpecRegistry:
    """Stub of vllm.v1.kv_cache_spec_registry.KVCacheSpecRegistry (no uniform-type
    merging is used)."""

    @staticmethod
    def get_uniform_type_base_spec(spec):
        return None


class DecodeBenchConnector:
    """Stub of vLLM's DecodeBenchConnector, which v1/__init__.py imports."""


class MultiModalFeatureSpec:
    """Stub of vllm.multimodal.inputs.MultiModalFeatureSpec (no multimodal inputs)."""


class PoolingParams:
    """Stub of vllm.pooling_params.PoolingParams (generative requests only)."""


@dataclasses.dataclass
class SamplingParams:
    """Stub of vllm.sampling_params.SamplingParams: the fields Request and the scheduler
    read. Sampling itself is the worker's deterministic model."""
    max_tokens: int = 16
    extra_args: dict = None
    skip_reading_prefix_cache: bool = None
    num_logprobs: int = None
    prompt_logprobs: int = None
    min_tokens: int = 0
    ignore_eos: bool = True
    stop_token_ids: list = None
    routed_experts_prompt_start: int = None
    sampling_type: int = 0


@dataclasses.dataclass
class LoRARequest:
    """Stub of vllm.lora.request.LoRARequest: what the block hasher (lora_name) and the
    scheduler (lora_int_id) read."""
    lora_name: str
    lora_int_id: int
    lora_path: str = ""


class FinishReason(enum.IntEnum):
    """Stub of vllm.v1.engine.FinishReason."""
    STOP = 0
    LENGTH = 1
    ABORT = 2
    ERROR = 3
    REPETITION = 4


class EngineCoreEventType(enum.IntEnum):
    """Stub of vllm.v1.engine.EngineCoreEventType."""
    QUEUED = 1
    SCHEDULED = 2
    PREEMPTED = 3


class EngineCoreEvent:
    """Stub of vllm.v1.engine.EngineCoreEvent (log_stats is off: never recorded)."""

    @classmethod
    def new_event(cls, event_type, timestamp=None):
        e = cls()
        e.type, e.timestamp = event_type, timestamp
        return e


class EngineCoreOutput:
    """Stub of vllm.v1.engine.EngineCoreOutput: keeps its keyword arguments."""

    def __init__(self, request_id, new_token_ids, finish_reason=None, **kwargs):
        self.request_id, self.new_token_ids = request_id, list(new_token_ids)
        self.finish_reason = finish_reason
        self.__dict__.update(kwargs)


class EngineCoreOutputs:
    """Stub of vllm.v1.engine.EngineCoreOutputs."""

    def __init__(self, outputs=None, finished_requests=None, scheduler_stats=None):
        self.outputs = outputs or []
        self.finished_requests = finished_requests
        self.scheduler_stats = scheduler_stats


class PrefillStats:
    """Stub of vllm.v1.metrics.stats.PrefillStats: keeps what the scheduler sets (the
    harness reads the external hit from it)."""

    def __init__(self):
        self.num_prompt_tokens = self.num_local_cached_tokens = None
        self.num_external_cached_tokens = None

    def set(self, num_prompt_tokens, num_local_cached_tokens, num_external_cached_tokens):
        self.num_prompt_tokens = num_prompt_tokens
        self.num_local_cached_tokens = num_local_cached_tokens
        self.num_external_cached_tokens = num_external_cached_tokens

    def finalize(self, num_cached_tokens):
        self.num_cached_tokens = num_cached_tokens


class PrefixCacheStats:
    """Stub of vllm.v1.metrics.stats.PrefixCacheStats (log_stats is off)."""

    def record(self, num_tokens, num_hits, preempted):
        pass


class StructuredOutputRequest:
    """Stub of vllm.v1.structured_output.request.StructuredOutputRequest: no request uses
    structured output."""

    @staticmethod
    def from_sampling_params(sampling_params):
        return None


class StructuredOutputManager:
    """Stub of vllm.v1.structured_output.StructuredOutputManager: no structured output."""

    def should_advance(self, request, new_token_ids=None):
        return False

    def grammar_bitmask(self, *a, **k):
        return None


class EncoderCacheManager:
    """Stub of vllm.v1.core.encoder_cache_manager.EncoderCacheManager: no encoder inputs."""

    def __init__(self, cache_size=0):
        self.cache_size = cache_size

    def free(self, request):
        pass

    def get_freed_mm_hashes(self):
        return []

    def get_cached_input_ids(self, request):
        return set()

    def reset(self):
        pass


class MultiModalRegistry:
    """Stub of vllm.multimodal.MultiModalRegistry: the model takes no multimodal input."""

    def supports_multimodal_inputs(self, model_config):
        return False


class PauseState(enum.IntEnum):
    """Stub of vllm.v1.core.sched.interface.PauseState."""
    UNPAUSED = 0
    PAUSED_NEW = 1
    PAUSED_ALL = 2


class SchedulerInterface:
    """Stub of vllm.v1.core.sched.interface.SchedulerInterface: its one default the
    scheduler relies on."""

    def has_unfinished_requests(self):
        return self.get_num_unfinished_requests() > 0


class SchedulingPolicy(enum.Enum):
    """Stand-in of vllm.v1.core.sched.request_queue.SchedulingPolicy."""
    FCFS = "fcfs"
    PRIORITY = "priority"


class FCFSRequestQueue(deque):
    """Stand-in of vllm.v1.core.sched.request_queue.FCFSRequestQueue (request_queue.py is
    not in VLLM_SRC): a deque with vLLM's queue method names, first come first served."""

    def add_request(self, request):
        self.append(request)

    def pop_request(self):
        return self.popleft()

    def peek_request(self):
        if not self:
            raise IndexError("peek from an empty queue")
        return self[0]

    def prepend_request(self, request):
        self.appendleft(request)

    def prepend_requests(self, requests):
        self.extendleft(reversed(list(requests)))

    def remove_request(self, request):
        self.remove(request)

    def remove_requests(self, requests):
        gone = set(requests)
        kept = [r for r in self if r not in gone]
        self.clear()
        self.extend(kept)


def create_request_queue(policy):
    """Stand-in of vllm.v1.core.sched.request_queue.create_request_queue (FCFS only)."""
    if policy != SchedulingPolicy.FCFS:
        raise HarnessError("only FCFS is stood in")
    return FCFSRequestQueue()


def remove_all(lst, items_to_remove):
    """Stand-in of vllm.v1.core.sched.utils.remove_all."""
    if not items_to_remove:
        return lst
    return [r for r in lst if r not in items_to_remove]


def check_stop(request, max_model_len, pooler_output=None):
    """Stand-in of vllm.v1.core.sched.utils.check_stop: the length limits (the model never
    emits an end-of-sequence token)."""
    if request.num_tokens >= max_model_len or request.num_output_tokens >= request.max_tokens:
        RequestStatus = sys.modules["vllm.v1.request"].RequestStatus
        request.status = RequestStatus.FINISHED_LENGTH_CAPPED
        return True
    return False


def record_function_or_nullcontext(name):
    """Stub of vllm.v1.utils.record_function_or_nullcontext (no profiler)."""
    return contextlib.nullcontext()


# The worker connector that vLLM's module-level kv_transfer_state would hold in the worker
# process, and the step the forward context belongs to.
_WORKER = threading.local()


def _active_worker():
    w = getattr(_WORKER, "worker", None)
    if w is None:
        raise HarnessError("no worker is executing")
    return w


def has_kv_transfer_group():
    """Stub of vllm.distributed.kv_transfer.has_kv_transfer_group: the executing worker has
    its connector."""
    return getattr(_WORKER, "worker", None) is not None


def get_kv_transfer_group():
    """Stub of vllm.distributed.kv_transfer.get_kv_transfer_group: the executing worker's
    connector (built by KVConnectorFactory with role WORKER)."""
    return _active_worker().connector


def is_v1_kv_transfer_group():
    """Stub of vllm.distributed.kv_transfer.is_v1_kv_transfer_group."""
    return True


@contextlib.contextmanager
def set_forward_context(attn_metadata, vllm_config, **kwargs):
    """Stub of vllm.forward_context.set_forward_context: records the step's metadata."""
    w = _active_worker()
    prev, w.forward_context = w.forward_context, types.SimpleNamespace(
        attn_metadata=attn_metadata, vllm_config=vllm_config)
    try:
        yield
    finally:
        w.forward_context = prev


def get_forward_context():
    """Stub of vllm.forward_context.get_forward_context."""
    return _active_worker().forward_context


def get_attention_context(layer_name):
    """Stub of vllm...attention.attention.get_attention_context: (attn_metadata, layer,
    kv_cache, slot_mapping) of a layer in the executing forward."""
    w = _active_worker()
    ctx = w.forward_context
    return (ctx.attn_metadata if ctx else None), None, w.kv_caches[layer_name], None


def _install_vllm_stubs(src):
    vdir = os.path.join(src, "vllm")
    _module("vllm.logger", "init_logger only", init_logger=init_logger)
    _module("vllm.envs", "the environment flags the loaded code reads, at vLLM's defaults",
            VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=False, VLLM_USE_V2_MODEL_RUNNER=None)
    _module("vllm.config", "package stub over VLLM_SRC's vllm/config (its __init__ needs "
            "pydantic)", os.path.join(vdir, "config"), VllmConfig=VllmConfigStub,
            get_current_vllm_config_or_none=lambda: None)
    _module("vllm.config.utils", "config: a plain dataclass", config=_config_decorator)
    _module("vllm.utils", "package stub over VLLM_SRC's vllm/utils",
            os.path.join(vdir, "utils"),
            length_from_prompt_token_ids_or_embeds=lambda ids, embeds=None:
                len(ids) if ids is not None else len(embeds),
            random_uuid=lambda: os.urandom(16).hex())
    _module("vllm.utils.math_utils", "cdiv, round_up", cdiv=cdiv, round_up=round_up)
    _module("vllm.utils.torch_utils", "dtype sizes; layer names as given",
            get_dtype_size=get_dtype_size, nvfp4_kv_cache_full_dim=lambda *a: None,
            _resolve_layer_name=lambda name: name, PIN_MEMORY=False)
    _module("vllm.compilation.cuda_graph", "CUDAGraphStat", CUDAGraphStat=CUDAGraphStat)
    _module("vllm.v1.attention.backend", "backend base classes as names",
            AttentionBackend=AttentionBackend, AttentionMetadata=AttentionMetadata)
    _module("vllm.v1.attention.backends.registry", "MambaAttentionBackendEnum",
            MambaAttentionBackendEnum=MambaAttentionBackendEnum)
    _module("vllm.v1.kv_cache_spec_registry", "KVCacheSpecRegistry",
            KVCacheSpecRegistry=KVCacheSpecRegistry)
    _module("vllm.distributed.kv_transfer", "the worker's kv_transfer_state: the executing "
            "worker's connector", os.path.join(vdir, "distributed", "kv_transfer"),
            has_kv_transfer_group=has_kv_transfer_group,
            get_kv_transfer_group=get_kv_transfer_group,
            is_v1_kv_transfer_group=is_v1_kv_transfer_group,
            kv_transfer_state=types.SimpleNamespace(_KV_CONNECTOR_AGENT=None))
    _module("vllm.distributed.kv_transfer.kv_connector.v1.decode_bench_connector",
            "DecodeBenchConnector, imported by v1/__init__.py",
            DecodeBenchConnector=DecodeBenchConnector)
    _module("vllm.forward_context", "the forward context of the executing worker",
            set_forward_context=set_forward_context, get_forward_context=get_forward_context,
            is_forward_context_available=lambda: _active_worker().forward_context is not None)
    _module("vllm.model_executor.layers.attention.attention", "get_attention_context",
            get_attention_context=get_attention_context)
    _module("vllm.multimodal", "the registry: no multimodal model",
            MULTIMODAL_REGISTRY=MultiModalRegistry(), MultiModalRegistry=MultiModalRegistry)
    _module("vllm.multimodal.inputs", "MultiModalFeatureSpec",
            MultiModalFeatureSpec=MultiModalFeatureSpec)
    _module("vllm.pooling_params", "PoolingParams", PoolingParams=PoolingParams)
    _module("vllm.sampling_params", "SamplingParams", SamplingParams=SamplingParams)
    _module("vllm.lora.request", "LoRARequest", LoRARequest=LoRARequest)
    _module("vllm.v1.engine", "engine-core output and event types",
            EngineCoreEvent=EngineCoreEvent, EngineCoreEventType=EngineCoreEventType,
            EngineCoreRequest=object, FinishReason=FinishReason,
            EngineCoreOutput=EngineCoreOutput, EngineCoreOutputs=EngineCoreOutputs)
    _module("vllm.v1.metrics.stats", "stats (log_stats is off)", PrefillStats=PrefillStats,
            PrefixCacheStats=PrefixCacheStats, SchedulerStats=object)
    _module("vllm.v1.structured_output.request", "no structured output",
            StructuredOutputRequest=StructuredOutputRequest)
    _module("vllm.v1.structured_output", "no structured output",
            StructuredOutputManager=StructuredOutputManager,
            StructuredOutputGrammar=object)
    _module("vllm.v1.core.encoder_cache_manager", "no encoder inputs",
            EncoderCacheManager=EncoderCacheManager,
            EncoderDecoderCacheManager=EncoderCacheManager)
    _module("vllm.v1.core.sched.interface", "PauseState, SchedulerInterface",
            PauseState=PauseState, SchedulerInterface=SchedulerInterface)
    _module("vllm.v1.core.sched.request_queue", "FCFS queue stand-in",
            SchedulingPolicy=SchedulingPolicy, RequestQueue=FCFSRequestQueue,
            create_request_queue=create_request_queue)
    _module("vllm.v1.core.sched.utils", "check_stop and remove_all stand-ins",
            check_stop=check_stop, remove_all=remove_all)
    hybrid = type("HybridKVCacheCoordinator", (), {})
    _module("vllm.v1.core.kv_cache_coordinator", "HybridKVCacheCoordinator as a type name "
            "(the coordinator is CoordinatorStandIn)",
            HybridKVCacheCoordinator=hybrid,
            get_kv_cache_coordinator=lambda **kw: make_coordinator(hybrid, **kw))
    _module("vllm.v1.core.block_pool", "BlockPool stand-in", BlockPool=None)
    # vllm.v1.utils: ConstantList from vLLM's source; the rest of the file needs torch.
    ns = {"Generic": typing.Generic, "Sequence": typing.Sequence, "TypeVar": typing.TypeVar,
          "overload": typing.overload, "T": typing.TypeVar("T")}
    utils = compile_functions(os.path.join(vdir, "v1", "utils.py"), ["ConstantList"], ns)
    _module("vllm.v1.utils", "ConstantList (compiled from vLLM's v1/utils.py) and a "
            "no-op record_function_or_nullcontext", ConstantList=utils["ConstantList"],
            record_function_or_nullcontext=record_function_or_nullcontext)


# ---------------------------------------------------------------------------------------
# Stand-ins for vLLM's block pool and KV-cache coordinator (block_pool.py and
# kv_cache_coordinator.py are not in VLLM_SRC)
# ---------------------------------------------------------------------------------------

class BlockPoolStandIn:
    """Stand-in of vllm.v1.core.block_pool.BlockPool: vLLM's KVCacheBlock and
    FreeKVCacheBlockQueue (compiled from kv_cache_utils.py), block 0 the null block, a
    prefix cache keyed by BlockHashWithGroupId, LRU eviction of cached free blocks. No GPU
    KV events (enable_kv_cache_events only concerns the connector's events here)."""

    def __init__(self, num_gpu_blocks, enable_caching, hash_block_size):
        u = V.kv_cache_utils
        self.num_gpu_blocks, self.enable_caching = num_gpu_blocks, enable_caching
        self.hash_block_size = hash_block_size
        self.blocks = [u.KVCacheBlock(i) for i in range(num_gpu_blocks)]
        self.free_block_queue = u.FreeKVCacheBlockQueue(self.blocks)
        self.cached_block_hash_to_block = {}
        self.null_block = self.free_block_queue.popleft()
        self.null_block.is_null = True

    def get_cached_block(self, block_hash, kv_cache_group_ids):
        out = []
        for gid in kv_cache_group_ids:
            blocks = self.cached_block_hash_to_block.get(
                V.kv_cache_utils.make_block_hash_with_group_id(block_hash, gid))
            if not blocks:
                return None
            out.append(next(iter(blocks.values())))
        return out

    def cache_full_blocks(self, request, blocks, num_cached_blocks, num_full_blocks,
                          block_size, kv_cache_group_id, block_mask=None):
        """As BlockPool.cache_full_blocks: blocks [num_cached, num_full) take the request's
        block hashes (which must exist: only tokens the request knows are cached)."""
        if num_cached_blocks >= num_full_blocks:
            return
        assert block_size == self.hash_block_size
        assert len(request.block_hashes) >= num_full_blocks, (
            "caching %d blocks of %s with %d block hashes" % (
                num_full_blocks, request.request_id, len(request.block_hashes)))
        for i in range(num_cached_blocks, num_full_blocks):
            blk = blocks[i]
            if blk.is_null or (block_mask is not None and not block_mask[i]):
                continue
            key = V.kv_cache_utils.make_block_hash_with_group_id(
                request.block_hashes[i], kv_cache_group_id)
            blk.set_block_hash(key, (i + 1) * block_size)
            self.cached_block_hash_to_block.setdefault(key, {})[blk.block_id] = blk

    def _maybe_evict_cached_block(self, blk):
        key = blk.block_hash
        if key is None:
            return False
        entry = self.cached_block_hash_to_block.get(key)
        if entry is not None:
            entry.pop(blk.block_id, None)
            if not entry:
                del self.cached_block_hash_to_block[key]
        blk.reset_hash()
        return True

    def get_new_blocks(self, num_blocks):
        if num_blocks > self.get_num_free_blocks():
            raise ValueError("Cannot get %d free blocks from the pool" % num_blocks)
        ret = self.free_block_queue.popleft_n(num_blocks)
        for blk in ret:
            if self.enable_caching:
                self._maybe_evict_cached_block(blk)
            assert blk.ref_cnt == 0
            blk.ref_cnt += 1
        return ret

    def touch(self, blocks):
        for blk in blocks:
            if blk.ref_cnt == 0 and not blk.is_null:
                self.free_block_queue.remove(blk)
            blk.ref_cnt += 1

    def free_blocks(self, ordered_blocks):
        blocks = list(ordered_blocks)
        for blk in blocks:
            blk.ref_cnt -= 1  # the null block's goes below 0, as in vLLM's BlockPool
            assert blk.ref_cnt >= 0 or blk.is_null, "block %d freed twice" % blk.block_id
        self.free_block_queue.append_n(
            [b for b in blocks if b.ref_cnt == 0 and not b.is_null])

    def evict_blocks(self, block_ids):
        for bid in block_ids:
            self._maybe_evict_cached_block(self.blocks[bid])

    def reset_prefix_cache(self):
        if self.num_gpu_blocks - self.get_num_free_blocks() != 1:  # only the null block
            return False
        self.cached_block_hash_to_block = {}
        for blk in self.blocks:
            blk.reset_hash()
        return True

    def get_num_free_blocks(self):
        return self.free_block_queue.num_free_blocks

    def get_usage(self):
        return 1.0 - self.get_num_free_blocks() / max(self.num_gpu_blocks - 1, 1)

    def take_events(self):
        return []


def make_coordinator(hybrid_type, **kw):
    """get_kv_cache_coordinator's stand-in: with a Mamba group, an instance of the
    HybridKVCacheCoordinator type too (KVCacheManager.get_computed_blocks_for_connector
    checks it)."""
    groups = kw["kv_cache_config"].kv_cache_groups
    if any(type(g.kv_cache_spec).__name__ == "MambaSpec" for g in groups):
        return type("HybridCoordinatorStandIn", (CoordinatorStandIn, hybrid_type), {})(**kw)
    return CoordinatorStandIn(**kw)


class CoordinatorStandIn:
    """Stand-in of vLLM's UnitaryKVCacheCoordinator and, for a full-attention group plus a
    sliding-window or Mamba group, of its HybridKVCacheCoordinator (kv_cache_coordinator.py
    is not in VLLM_SRC): vLLM's own FullAttentionManager, SlidingWindowManager and
    MambaManager (compiled from single_type_kv_cache_manager.py) over BlockPoolStandIn, of
    one block size: one full-attention group and any number of sliding-window or Mamba
    groups (all of one type), in any order. find_longest_cache_hit walks the request's block
    hashes in the full-attention group until the first miss (FullAttentionManager's,
    without EAGLE); the other groups then find their hit within that, together, with their
    manager's find_longest_cache_hit, and the full-attention hit is cut to it (the hybrid
    coordinator's fixed point, one pass for two types). find_longest_cache_hit_per_group is
    the coordinator's per-group lookup (each type alone), which vLLM's
    get_computed_blocks_for_connector uses for a Mamba hybrid."""

    def __init__(self, kv_cache_config, max_model_len, enable_caching, scheduler_block_size,
                 hash_block_size, **unused):
        groups = kv_cache_config.kv_cache_groups
        self.block_pool = BlockPoolStandIn(kv_cache_config.num_blocks, enable_caching,
                                           hash_block_size)
        kinds = [type(g.kv_cache_spec).__name__ for g in groups]
        managers = {"FullAttentionSpec": V.FullAttentionManager,
                    "SlidingWindowSpec": V.SlidingWindowManager,
                    "MambaSpec": V.MambaManager}
        others = sorted(set(kinds) - {"FullAttentionSpec"})
        assert kinds.count("FullAttentionSpec") == 1 and len(others) <= 1 and \
            set(others) <= set(managers), kinds
        self.full_attention_group_id = kinds.index("FullAttentionSpec")
        self.other_ids = [i for i, k in enumerate(kinds) if k != "FullAttentionSpec"]
        self.other = managers[others[0]] if others else None
        self.single_type_managers = tuple(managers[k](
            g.kv_cache_spec, block_pool=self.block_pool, enable_caching=enable_caching,
            kv_cache_group_id=i, scheduler_block_size=scheduler_block_size,
            needs_kv_cache_zeroing=kv_cache_config.needs_kv_cache_zeroing)
            for i, (k, g) in enumerate(zip(kinds, groups)))
        self.specs = [g.kv_cache_spec for g in groups]
        self.block_size = self.specs[0].block_size
        assert all(s.block_size == self.block_size for s in self.specs)

    def _full_attention_hit(self, block_hashes, max_cache_hit_length):
        hit = []
        for h in block_hashes[:max_cache_hit_length // self.block_size]:
            cached = self.block_pool.get_cached_block(h, [self.full_attention_group_id])
            if cached is None:
                break
            hit.append(cached[0])
        return hit

    def _other_hits(self, block_hashes, max_length):
        """{group: its hit blocks} for the other groups, and their common hit length."""
        blocks, length = self.other.find_longest_cache_hit(
            block_hashes, max_length, self.other_ids, self.block_pool,
            self.specs[self.other_ids[0]], False, self.block_size)
        return dict(zip(self.other_ids, blocks)), length

    def _by_group(self, full_attention, others):
        return tuple(full_attention if i == self.full_attention_group_id else others[i]
                     for i in range(len(self.specs)))

    def find_longest_cache_hit(self, block_hashes, max_cache_hit_length):
        hit = self._full_attention_hit(block_hashes, max_cache_hit_length)
        if self.other is None:
            return (hit,), len(hit) * self.block_size, 0
        others, length = self._other_hits(block_hashes, len(hit) * self.block_size)
        return self._by_group(hit[:length // self.block_size], others), length, 0

    def find_longest_cache_hit_per_group(self, block_hashes, max_cache_hit_length):
        hit = self._full_attention_hit(block_hashes, max_cache_hit_length)
        others, length = self._other_hits(block_hashes, max_cache_hit_length)
        return (self._by_group(hit, others),
                self._by_group(len(hit) * self.block_size, {i: length for i in others}))

    def get_num_blocks_to_allocate(self, request_id, num_tokens, new_computed_blocks,
                                   num_encoder_tokens, total_computed_tokens,
                                   num_local_computed_tokens, num_tokens_main_model,
                                   apply_admission_cap=False):
        return sum(m.get_num_blocks_to_allocate(
            request_id, num_tokens, new_computed_blocks[i], total_computed_tokens,
            num_local_computed_tokens, num_tokens_main_model, apply_admission_cap)
            for i, m in enumerate(self.single_type_managers))

    def allocate_new_computed_blocks(self, request_id, new_computed_blocks,
                                     num_local_computed_tokens, num_external_computed_tokens):
        for i, m in enumerate(self.single_type_managers):
            m.add_local_computed_blocks(request_id, new_computed_blocks[i],
                                        num_local_computed_tokens, num_external_computed_tokens)
        for m in self.single_type_managers:
            m.allocate_external_computed_blocks(request_id, num_local_computed_tokens,
                                                num_external_computed_tokens)

    def allocate_new_blocks(self, request_id, num_tokens, num_tokens_main_model,
                            num_encoder_tokens=0):
        return tuple(m.allocate_new_blocks(request_id, num_tokens, num_tokens_main_model)
                     for m in self.single_type_managers)

    def cache_blocks(self, request, num_computed_tokens):
        for m in self.single_type_managers:
            m.cache_blocks(request, num_computed_tokens)

    def free(self, request_id):
        for m in self.single_type_managers:
            m.free(request_id)

    def pop_blocks_for_free(self, request_id):
        blocks = []
        for m in self.single_type_managers:
            blocks.extend(m.pop_blocks_for_free(request_id))
        return blocks

    def remove_skipped_blocks(self, request_id, num_computed_tokens, num_prompt_tokens=None):
        for m in self.single_type_managers:
            m.remove_skipped_blocks(request_id, num_computed_tokens, num_prompt_tokens)

    def get_blocks(self, request_id):
        return tuple(m.req_to_blocks.get(request_id) or [] for m in self.single_type_managers)

    def get_num_common_prefix_blocks(self, running_request_id):
        return [m.get_num_common_prefix_blocks(running_request_id)
                for m in self.single_type_managers]

    def new_step_starts(self):
        for m in self.single_type_managers:
            m.new_step_starts()


# ---------------------------------------------------------------------------------------
# Setting vLLM up
# ---------------------------------------------------------------------------------------

V = types.SimpleNamespace()  # the loaded vLLM pieces, once setup() ran
_STATE = {}

SCHEDULER_METHODS = [
    "__init__", "schedule", "_build_kv_connector_meta", "_get_new_block_ids_to_zero",
    "_preempt_request", "_update_after_schedule", "_make_cached_request_data",
    "get_grammar_bitmask", "update_from_output", "_is_blocked_waiting_status",
    "_enqueue_waiting_request", "_select_waiting_queue_for_scheduling",
    "_handle_stopped_request", "_update_request_with_output", "_free_encoder_inputs",
    "update_draft_token_ids", "get_request_counts", "add_request", "finish_requests",
    "_free_request", "_free_blocks", "pause_state", "set_pause_state",
    "_free_request_blocks", "_free_cow_retained_blocks", "_drain_deferred_frees",
    "get_num_unfinished_requests", "has_finished_requests", "has_requests",
    "reset_prefix_cache", "reset_connector_cache", "make_stats", "make_spec_decoding_stats",
    "shutdown", "get_kv_connector", "_connector_finished", "_request_remaining_blocks",
    "_inflight_prefill_reserved_blocks", "_update_waiting_for_remote_kv",
    "_try_promote_blocked_waiting_request", "_update_from_kv_xfer_finished",
    "_update_requests_with_invalid_blocks", "_handle_invalid_blocks",
    "_mamba_block_aligned_split"]
KV_CACHE_MANAGER_METHODS = [
    "__init__", "usage", "make_prefix_cache_stats", "prefix_cache_lookup_enabled",
    "record_prefix_cache_stats", "get_computed_blocks", "get_computed_blocks_for_connector",
    "allocate_slots", "free", "remove_skipped_blocks", "pop_blocks_for_free", "evict_blocks",
    "reset_prefix_cache", "get_num_common_prefix_blocks", "take_events", "get_blocks",
    "get_block_ids", "get_block_ids_for_computed_tokens", "estimate_cached_tokens",
    "cache_blocks", "create_kv_cache_blocks", "take_new_block_ids",
    "get_zeroing_block_ids_in_range", "record_blocks_for_zeroing",
    "take_kv_cache_block_copies", "new_step_starts"]
SINGLE_TYPE_METHODS = [
    "__init__", "_get_num_evictable_blocks", "_has_partial_local_hit",
    "get_num_blocks_to_allocate", "add_local_computed_blocks",
    "allocate_external_computed_blocks", "allocate_new_blocks", "records_new_block_ids",
    "take_new_block_ids", "take_pending_cow_copies", "_apply_cow", "cache_blocks",
    "reachable_block_mask", "pop_blocks_for_free", "free", "_remove_blocks_in_range",
    "remove_skipped_blocks", "get_num_skipped_tokens", "new_step_starts"]


def vllm_src():
    return os.environ.get("VLLM_SRC")


def skip_module_without_vllm(what):
    """Skips the calling test module, saying so, unless VLLM_SRC holds vLLM's source; `what`
    names the tests that cannot run."""
    src = vllm_src()
    if not src or not os.path.isfile(os.path.join(src, "vllm", "v1", "core", "sched",
                                                   "scheduler.py")):
        import pytest
        pytest.skip("VLLM_SRC is not set to vLLM's source (e.g. VLLM_SRC=../shared/vllm): "
                    "%s cannot run" % what, allow_module_level=True)


def setup():
    """Loads vLLM from $VLLM_SRC once (returns V), then (re)imports kvtier.vllm so that its
    KvtierConnector subclasses vLLM's real KVConnectorBase_V1."""
    if _STATE.get("ready"):
        return V
    src = os.path.abspath(vllm_src())
    vdir = os.path.join(src, "vllm")
    _STATE["modules_before"] = set(sys.modules)
    _STATE["path"] = src
    sys.path.insert(0, src)
    _install_third_party_stubs()
    _install_vllm_stubs(src)

    # kv_cache_utils: the hashing functions and block classes, from vLLM's file.
    path = os.path.join(vdir, "v1", "core", "kv_cache_utils.py")
    ns = import_namespace(path, "vllm.v1.core.kv_cache_utils", "holds only functions and "
                          "classes compiled from vLLM's kv_cache_utils.py (the rest of that "
                          "file needs torch)")
    ns.update(logger=init_logger("vllm.v1.core.kv_cache_utils"),
              BlockHash=bytes, BlockHashWithGroupId=bytes, ExternalBlockHash=bytes | int)
    names = ["make_block_hash_with_group_id", "get_block_hash", "get_group_id",
             "maybe_convert_block_hash", "_CBOR_HASH_FUNCTIONS", "init_none_hash",
             "KVCacheBlock", "KVCacheBlockCopy",
             "FreeKVCacheBlockQueue", "need_extra_keys", "_gen_mm_extra_hash_keys",
             "_gen_lora_extra_hash_keys", "_gen_prompt_embeds_extra_hash_keys",
             "generate_block_hash_extra_keys", "hash_block_tokens", "get_request_block_hasher",
             "BlockHashListWithBlockSize", "BlockHashList", "resolve_block_hashes"]
    compile_functions(path, names, ns)
    V.kv_cache_utils = sys.modules["vllm.v1.core.kv_cache_utils"]

    # real modules
    V.hashing = importlib.import_module("vllm.utils.hashing")
    V.kv_transfer_config = importlib.import_module("vllm.config.kv_transfer")
    V.kv_events_config = importlib.import_module("vllm.config.kv_events")
    V.output = importlib.import_module("vllm.v1.core.sched.output")
    V.outputs = importlib.import_module("vllm.v1.outputs")
    V.request = importlib.import_module("vllm.v1.request")
    V.kv_cache_interface = importlib.import_module("vllm.v1.kv_cache_interface")
    V.kv_events = importlib.import_module("vllm.distributed.kv_events")
    V.base = importlib.import_module("vllm.distributed.kv_transfer.kv_connector.v1.base")
    V.v1 = importlib.import_module("vllm.distributed.kv_transfer.kv_connector.v1")
    V.factory_mod = importlib.import_module("vllm.distributed.kv_transfer.kv_connector.factory")
    V.KVConnectorFactory = V.factory_mod.KVConnectorFactory
    V.Request, V.RequestStatus = V.request.Request, V.request.RequestStatus

    # KVCacheBlocks and the KV cache manager (its methods from kv_cache_manager.py)
    path = os.path.join(vdir, "v1", "core", "kv_cache_manager.py")
    ns = import_namespace(path, "vllm.v1.core.kv_cache_manager")
    ns["logger"] = init_logger("vllm.v1.core.kv_cache_manager")
    compile_functions(path, ["KVCacheBlocks"], ns)
    V.KVCacheBlocks = ns["KVCacheBlocks"]
    V.KVCacheManager = compile_class(path, "KVCacheManager", KV_CACHE_MANAGER_METHODS, ns)

    path = os.path.join(vdir, "v1", "core", "single_type_kv_cache_manager.py")
    ns = import_namespace(path, "vllm.v1.core.single_type_kv_cache_manager")
    base = compile_class(path, "SingleTypeKVCacheManager", SINGLE_TYPE_METHODS, ns)
    V.FullAttentionManager = compile_class(
        path, "FullAttentionManager",
        ["cache_blocks", "_cache_partial_tail_block", "get_num_common_prefix_blocks"], ns,
        bases=(base,))
    V.SlidingWindowManager = compile_class(
        path, "SlidingWindowManager",
        ["__init__", "_contiguous_blocks_for_hit", "find_longest_cache_hit",
         "reachable_block_mask", "get_num_skipped_tokens", "get_num_common_prefix_blocks"], ns,
        bases=(base,), attrs={"supports_fine_grained_hash_lookup": False})  # vLLM's default
    V.MambaManager = compile_class(
        path, "MambaManager",
        ["__init__", "find_longest_cache_hit", "reachable_block_mask", "remove_skipped_blocks",
         "get_num_common_prefix_blocks", "get_num_blocks_to_allocate", "allocate_new_blocks",
         "pop_blocks_for_free", "get_num_skipped_tokens", "cache_blocks", "new_step_starts",
         "_cache_partial_tail_block"], ns,
        bases=(base,), attrs={"supports_fine_grained_hash_lookup": True})

    # the scheduler, and the async scheduler's overrides
    path = os.path.join(vdir, "v1", "core", "sched", "scheduler.py")
    ns = import_namespace(path, "vllm.v1.core.sched.scheduler")
    ns["logger"] = init_logger("vllm.v1.core.sched.scheduler")
    V.Scheduler = compile_class(path, "Scheduler", SCHEDULER_METHODS, ns,
                                bases=(SchedulerInterface,))
    path = os.path.join(vdir, "v1", "core", "sched", "async_scheduler.py")
    ns = import_namespace(path, "vllm.v1.core.sched.async_scheduler")
    ns["logger"] = init_logger("vllm.v1.core.sched.async_scheduler")
    V.AsyncScheduler = compile_class(
        path, "AsyncScheduler", ["__init__", "_update_after_schedule",
                                 "_update_request_with_output"], ns, bases=(V.Scheduler,))

    # FlashAttention's KV cache shape and stride order (NHD: no connector asks otherwise)
    path = os.path.join(vdir, "v1", "attention", "backends", "flash_attn.py")
    V.FlashAttentionBackend = compile_class(
        path, "FlashAttentionBackend", ["get_kv_cache_shape", "get_kv_cache_stride_order"],
        {"get_kv_cache_layout": lambda: "NHD", "__name__": "flash_attn"})

    # the model runner's connector context, and the attention op's layer hooks
    path = os.path.join(vdir, "v1", "worker", "kv_connector_model_runner_mixin.py")
    ns = import_namespace(path, "vllm.v1.worker.kv_connector_model_runner_mixin")
    ns["logger"] = init_logger(ns["__name__"])
    V.Mixin = compile_class(path, "KVConnectorModelRunnerMixin", [
        "kv_connector_no_forward", "maybe_get_kv_connector_output", "finalize_kv_connector",
        "_get_kv_connector_output"], ns)
    path = os.path.join(vdir, "model_executor", "layers", "attention", "kv_transfer_utils.py")
    ns = import_namespace(path, "vllm.model_executor.layers.attention.kv_transfer_utils")
    V.maybe_transfer_kv_layer = compile_functions(path, ["maybe_transfer_kv_layer"],
                                                  ns)["maybe_transfer_kv_layer"]

    # the executor's aggregation of every rank's KVConnectorOutput (N workers)
    path = os.path.join(vdir, "distributed", "kv_transfer", "kv_connector", "utils.py")
    ns = import_namespace(path, "vllm.distributed.kv_transfer.kv_connector.utils",
                          "holds only KVOutputAggregator, compiled from vLLM's "
                          "kv_connector/utils.py (the rest of that file needs torch)")
    ns["logger"] = init_logger(ns["__name__"])
    V.KVOutputAggregator = compile_class(path, "KVOutputAggregator",
                                         ["__init__", "from_connector", "aggregate"], ns)

    # VllmConfig's properties that the scheduler reads
    path = os.path.join(vdir, "config", "vllm.py")
    V.VllmConfigProps = compile_class(path, "VllmConfig", [
        "max_concurrent_batches", "max_in_flight_tokens", "num_speculative_tokens"],
        {"__name__": "vllm.config.vllm"}, name="VllmConfigProps")

    # a KV events publisher that keeps what the scheduler publishes
    if "harness" not in V.kv_events.EventPublisherFactory._registry:
        V.kv_events.EventPublisherFactory.register_publisher("harness", RecordingPublisher)

    # kvtier.vllm imports vLLM's base classes when vLLM imports: (re)import it now.
    import kvtier.vllm
    V.kvtier_vllm = importlib.reload(kvtier.vllm)
    if not issubclass(V.kvtier_vllm.KvtierConnector, V.base.KVConnectorBase_V1):
        raise HarnessError("kvtier.vllm did not pick up vLLM's KVConnectorBase_V1")
    _STATE["ready"] = True
    return V


def teardown():
    """Removes the loaded vLLM and the stubs, and re-imports kvtier.vllm without them (for
    test modules that run later in the same process)."""
    if not _STATE.get("ready"):
        return
    for name in set(sys.modules) - _STATE["modules_before"]:
        if name == "vllm" or name.startswith("vllm.") or name in (
                "torch", "numpy", "numpy.typing", "typing_extensions", "msgspec", "cbor2"):
            del sys.modules[name]
    with contextlib.suppress(ValueError):
        sys.path.remove(_STATE["path"])
    import kvtier.vllm
    importlib.reload(kvtier.vllm)
    _STATE.clear()


class RecordingPublisher:
    """A KV-event publisher (registered in vLLM's EventPublisherFactory as "harness"): keeps
    the KVEventBatch objects the scheduler publishes."""

    def __init__(self, data_parallel_rank=0, **config):
        self.batches = []

    def publish(self, events):
        self.batches.append(events)

    def shutdown(self):
        pass


# ---------------------------------------------------------------------------------------
# Configuration stand-ins (vllm/config/*.py need pydantic 2): the fields the loaded code
# reads, at vLLM's defaults unless a test sets them
# ---------------------------------------------------------------------------------------

@dataclasses.dataclass
class SchedulerConfig:
    """Stand-in of vllm.config.SchedulerConfig: the fields Scheduler reads."""
    max_num_seqs: int = 8
    max_num_batched_tokens: int = 256
    max_num_scheduled_tokens: int = None
    policy: str = "fcfs"
    watermark: float = 0.0
    scheduler_reserve_full_isl: bool = False
    long_prefill_token_threshold: int = 0
    enable_chunked_prefill: bool = True
    async_scheduling: bool = True
    disable_hybrid_kv_cache_manager: bool = None


@dataclasses.dataclass
class CacheConfig:
    """Stand-in of vllm.config.CacheConfig."""
    block_size: int = 16
    num_gpu_blocks: int = None
    enable_prefix_caching: bool = True
    prefix_caching_hash_algo: str = "sha256"
    mamba_cache_mode: str = "none"
    kv_sharing_fast_prefill: bool = False


@dataclasses.dataclass
class ParallelConfig:
    """Stand-in of vllm.config.ParallelConfig: world_size = PP x TP (x PCP), and rank, the
    worker's global rank (vLLM's WorkerBase sets it; the multiproc executor numbers ranks
    with TP rank = rank % TP, PP rank = rank // TP)."""
    world_size: int = 1
    rank: int = 0
    pipeline_parallel_size: int = 1
    tensor_parallel_size: int = 1
    data_parallel_size: int = 1
    data_parallel_index: int = 0
    data_parallel_rank: int = 0
    decode_context_parallel_size: int = 1
    prefill_context_parallel_size: int = 1
    distributed_executor_backend: str = "mp"


@dataclasses.dataclass
class ModelConfig:
    """Stand-in of vllm.config.ModelConfig."""
    max_model_len: int = 1024
    is_encoder_decoder: bool = False
    is_diffusion: bool = False
    enable_return_routed_experts: bool = False
    runner_type: str = "generate"


@dataclasses.dataclass
class ObservabilityConfig:
    """Stand-in of vllm.config.ObservabilityConfig: no metrics."""
    kv_cache_metrics: bool = False
    enable_mfu_metrics: bool = False
    enable_logging_iteration_details: bool = False


@dataclasses.dataclass
class SpeculativeConfig:
    """Stand-in of vllm.config.SpeculativeConfig: a draft model proposing
    num_speculative_tokens tokens (allowed with async scheduling; lookahead slots as vLLM
    allocates for a draft model)."""
    num_speculative_tokens: int = 2
    method: str = "draft_model"
    num_speculative_tokens_per_batch_size: dict = None
    disable_padded_drafter_batch: bool = False

    def use_eagle(self):
        return False

    def uses_draft_model(self):
        return True

    def use_dflash(self):
        return False

    def use_dspark(self):
        return False

    def use_ngram_gpu(self):
        return False


def make_vllm_config(extra, *, async_scheduling, block_size, num_gpu_blocks, max_model_len,
                     max_num_batched_tokens, max_num_seqs, num_spec_tokens, kv_events,
                     kv_load_failure_policy, long_prefill_token_threshold=0, world_size=None,
                     enable_prefix_caching=True, tensor_parallel_size=1,
                     pipeline_parallel_size=1, rank=0, decode_context_parallel_size=1,
                     prefill_context_parallel_size=1, mamba_cache_mode="none"):
    """A VllmConfig with kvtier.vllm as the KV connector (kv_both), built as vLLM builds it
    for `--kv-transfer-config '{"kv_connector": "KvtierConnector", "kv_connector_module_path":
    "kvtier.vllm", ...}'`; world_size defaults to PP x TP x PCP, as vLLM computes it, and rank
    is the worker's (the scheduler's config keeps 0)."""
    if world_size is None:
        world_size = (pipeline_parallel_size * tensor_parallel_size
                      * prefill_context_parallel_size)
    ktc = V.kv_transfer_config.KVTransferConfig(
        kv_connector="KvtierConnector", kv_connector_module_path="kvtier.vllm",
        kv_role="kv_both", kv_connector_extra_config=dict(extra),
        kv_load_failure_policy=kv_load_failure_policy, engine_id="harness",
        kv_buffer_device="cpu")
    cfg = VllmConfig(
        kv_transfer_config=ktc,
        scheduler_config=SchedulerConfig(
            max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
            async_scheduling=async_scheduling,
            long_prefill_token_threshold=long_prefill_token_threshold),
        cache_config=CacheConfig(block_size=block_size, num_gpu_blocks=num_gpu_blocks,
                                 enable_prefix_caching=enable_prefix_caching,
                                 mamba_cache_mode=mamba_cache_mode),
        model_config=ModelConfig(max_model_len=max_model_len),
        parallel_config=ParallelConfig(
            world_size=world_size, rank=rank, tensor_parallel_size=tensor_parallel_size,
            pipeline_parallel_size=pipeline_parallel_size,
            decode_context_parallel_size=decode_context_parallel_size,
            prefill_context_parallel_size=prefill_context_parallel_size),
        speculative_config=SpeculativeConfig(num_spec_tokens) if num_spec_tokens else None,
        kv_events_config=V.kv_events_config.KVEventsConfig(
            enable_kv_cache_events=True, publisher="harness") if kv_events else None)
    return cfg


class VllmConfig:
    """Stand-in of vllm.config.VllmConfig: the sub-configs, and vLLM's own properties
    max_concurrent_batches, max_in_flight_tokens and num_speculative_tokens (compiled onto
    it from config/vllm.py in __init__). As VllmConfig.__post_init__ does, the hybrid KV cache
    manager is turned off when the connector does not support HMA."""
    use_v2_model_runner = False

    def __init__(self, kv_transfer_config, scheduler_config, cache_config, model_config,
                 parallel_config, speculative_config=None, kv_events_config=None):
        self.kv_transfer_config, self.scheduler_config = kv_transfer_config, scheduler_config
        self.cache_config, self.model_config = cache_config, model_config
        self.parallel_config, self.speculative_config = parallel_config, speculative_config
        self.kv_events_config = kv_events_config
        self.lora_config = self.ec_transfer_config = self.diffusion_config = None
        self.observability_config = ObservabilityConfig()
        if scheduler_config.disable_hybrid_kv_cache_manager is None:
            scheduler_config.disable_hybrid_kv_cache_manager = not (
                V.KVConnectorFactory.supports_hma_config(kv_transfer_config))

    def __getattr__(self, name):  # vLLM's properties, compiled from config/vllm.py
        prop = V.VllmConfigProps.__dict__.get(name)
        if isinstance(prop, property):
            return prop.fget(self)
        raise AttributeError(name)


# ---------------------------------------------------------------------------------------
# KV caches: host memory laid out as FlashAttention's
# ---------------------------------------------------------------------------------------

class KVTensor:
    """Stand-in of a torch.Tensor view over a ctypes buffer: data_ptr(), stride(d) in
    elements, shape, size(), element_size(), numel(), device (type "cpu"), dtype, permute."""

    def __init__(self, buf, shape, strides, offset, dtype):
        self.buf, self.shape, self._strides = buf, tuple(shape), tuple(strides)
        self._offset, self.dtype = offset, dtype
        self.device = types.SimpleNamespace(type="cpu", index=None)

    @classmethod
    def empty(cls, shape, dtype):
        n = math.prod(shape)
        buf = (ctypes.c_uint8 * (n * dtype.itemsize))()
        strides = [math.prod(shape[i + 1:]) for i in range(len(shape))]
        return cls(buf, shape, strides, 0, dtype)

    def data_ptr(self):
        return ctypes.addressof(self.buf) + self._offset * self.dtype.itemsize

    def stride(self, dim=None):
        return self._strides if dim is None else self._strides[dim]

    def size(self, dim=None):
        return self.shape if dim is None else self.shape[dim]

    def dim(self):
        return len(self.shape)

    def element_size(self):
        return self.dtype.itemsize

    def numel(self):
        return math.prod(self.shape)

    def permute(self, *dims):
        return KVTensor(self.buf, [self.shape[d] for d in dims],
                        [self._strides[d] for d in dims], self._offset, self.dtype)

    def __getitem__(self, i):
        """The view at index i of the first dimension (as tensor[i])."""
        return KVTensor(self.buf, self.shape[1:], self._strides[1:],
                        self._offset + i * self._strides[0], self.dtype)

    def byte_offset(self, index):
        return (self._offset + sum(i * s for i, s in zip(index, self._strides))) \
            * self.dtype.itemsize


def attention_spec(kv_cache_config):
    """The spec of the first attention group (a Mamba hybrid's groups may start with Mamba):
    the page and block layout every tensor has."""
    return next(g.kv_cache_spec for g in kv_cache_config.kv_cache_groups
                if type(g.kv_cache_spec).__name__ != "MambaSpec")


def allocate_kv_caches(kv_cache_config, layer_names):
    """One tensor per layer as vLLM's _reshape_attention_kv_cache makes it: FlashAttention's
    logical shape (num_blocks, num_kv_heads, block_size, 2 * head_size) permuted by its NHD
    stride order, allocated flat in that physical order, then permuted back (so the logical
    view's strides are not logical-contiguous). A Mamba layer's cache is the tensor's pages
    as GPUModelRunner views them for a KV connector: int8 (num_blocks, 1, 1, page_size)
    over the same bytes (the attention layer sharing the tensor has its blocks outermost,
    so page b is block b of either)."""
    spec = attention_spec(kv_cache_config)
    fa = V.FlashAttentionBackend
    shape = fa.get_kv_cache_shape(kv_cache_config.num_blocks, spec.block_size,
                                  spec.num_kv_heads, spec.head_size)
    order = fa.get_kv_cache_stride_order()
    inv_order = [order.index(i) for i in range(len(order))]
    caches = {}
    for t in kv_cache_config.kv_cache_tensors:
        assert t.size == spec.page_size_bytes * kv_cache_config.num_blocks
        raw = KVTensor.empty([shape[i] for i in order], spec.dtype)
        assert raw.numel() * spec.dtype.itemsize == t.size
        mamba = {n for g in kv_cache_config.kv_cache_groups for n in g.layer_names
                 if type(g.kv_cache_spec).__name__ == "MambaSpec"}
        page = spec.page_size_bytes
        for name in t.shared_by:
            caches[name] = KVTensor(raw.buf, (kv_cache_config.num_blocks, 1, 1, page),
                                    (page, page, page, 1), 0, sys.modules["torch"].int8) \
                if name in mamba else raw.permute(*inv_order)
    return {name: caches[name] for name in layer_names}


def allocate_uniform_kv_caches(kv_cache_config, layer_names):
    """What KVConnectorModelRunnerMixin.allocate_uniform_kv_caches makes for a connector that
    prefers cross-layer blocks: one buffer of every layer, shaped (num_layers,) +
    FlashAttention's logical shape and laid out in its include_num_layers_dimension stride
    order (blocks outermost, the layers inside a block); each layer's cache is the view
    [i] of the logical permutation. Returns (the layers' caches, the physical tensor that
    register_cross_layers_kv_cache receives)."""
    spec = kv_cache_config.kv_cache_groups[0].kv_cache_spec
    fa = V.FlashAttentionBackend
    shape = (len(kv_cache_config.kv_cache_tensors),) + tuple(fa.get_kv_cache_shape(
        kv_cache_config.num_blocks, spec.block_size, spec.num_kv_heads, spec.head_size))
    order = fa.get_kv_cache_stride_order(include_num_layers_dimension=True)
    raw = KVTensor.empty([shape[i] for i in order], spec.dtype)
    logical = raw.permute(*[order.index(i) for i in range(len(order))])
    caches = {}
    for i, t in enumerate(kv_cache_config.kv_cache_tensors):
        for name in t.shared_by:
            caches[name] = logical[i]
    return {name: caches[name] for name in layer_names}, raw


# ---------------------------------------------------------------------------------------
# The model: deterministic tokens and KV bytes
# ---------------------------------------------------------------------------------------

VOCAB = 1000


def next_token(tokens):
    """The model's greedy next token after `tokens`."""
    h = hashlib.blake2b(repr((len(tokens), tuple(tokens[-8:]))).encode(), digest_size=8)
    return 10 + int.from_bytes(h.digest(), "little") % VOCAB


def expected_output(prompt, n):
    toks = list(prompt)
    for _ in range(n):
        toks.append(next_token(toks))
    return toks[len(prompt):]


def prefix_digests(ctx, tokens):
    """d[p]: a digest of (ctx, tokens[:p + 1]): what the KV at position p depends on."""
    h, out = hashlib.blake2b(repr(ctx).encode(), digest_size=16).digest(), []
    for t in tokens:
        h = hashlib.blake2b(h + int(t).to_bytes(8, "little", signed=True),
                            digest_size=16).digest()
        out.append(h)
    return out


def kv_bytes(digest, layer, head, n):
    """The K and V (n bytes) the forward writes for one (position, layer, head)."""
    return hashlib.shake_128(digest + bytes((layer, head))).digest(n)


# ---------------------------------------------------------------------------------------
# The worker: GPUModelRunner's connector order around a deterministic model
# ---------------------------------------------------------------------------------------

@dataclasses.dataclass
class _ReqState:
    """The worker's CachedRequestState: its own tokens (the sampled ones included, as the
    GPU keeps them under async scheduling), block table and computed count."""
    req_id: str
    tokens: list
    num_prompt: int
    block_ids: list
    num_computed: int
    ctx: tuple
    drafts: list = dataclasses.field(default_factory=list)
    last_rejected: int = 0
    last_step: int = -1


class Worker:
    """The worker process: its connector is built by vLLM's KVConnectorFactory with role
    WORKER and gets the KV caches through register_kv_caches. execute_model follows
    GPUModelRunner.execute_model/sample_tokens (V1): handle_preemptions, _update_states'
    bookkeeping, then either KVConnectorModelRunnerMixin.kv_connector_no_forward (nothing
    scheduled) or the forward inside the mixin's _get_kv_connector_output, each attention
    layer as Attention.forward runs it: the new KV written, then the attention op wrapped by
    vLLM's maybe_transfer_kv_layer (wait_for_layer_load, the reads, save_kv_layer); with
    speculative decoding the connector is finalized after drafting
    (defer_finalize). Everything it receives and returns crosses a pickle.

    The forward checks its inputs: for every scheduled request, every position below
    num_computed_tokens must hold, in each layer, exactly the bytes the forward writes for
    that prefix (kv_bytes of prefix_digests), as attention would read them. A request whose
    inputs are wrong writes poisoned KV (garbage in, garbage out). Mismatches in blocks the
    step's KVConnectorOutput.invalid_block_ids names (or an earlier step's, in slots not
    rewritten since, and KV computed over those) follow from the connector's reported
    failures; any other is recorded in `errors`.

    One of N ranks (WorkerProc): its KV caches hold its shard, the layers from layer0 and
    the KV heads from head0 of the model's (kv_bytes takes the global layer and head, so a
    shard loaded into another rank's caches fails the check); a PP stage that is not the
    last returns ModelRunnerOutput.with_kv_conn_output_only, as GPUModelRunner does (it
    samples too, standing in for the last stage's broadcast of the sampled tokens)."""

    def __init__(self, vllm_config, kv_cache_config, ctx_of, async_scheduling, layer0=0,
                 head0=0, last_stage=True):
        self.vllm_config, self.kv_cache_config = vllm_config, kv_cache_config
        self.layer0, self.head0, self.last_stage = layer0, head0, last_stage
        # request -> the positions below its computed count that the forward read (checked)
        self.reads = defaultdict(set)
        spec = attention_spec(kv_cache_config)
        self.block_size, self.num_kv_heads = spec.block_size, spec.num_kv_heads
        self.head_size, self.el = spec.head_size, spec.dtype.itemsize
        # the layers in model order, and each one's KV cache group and sliding window
        self.group_of, self.window_of, self.mamba_of = {}, {}, {}
        for g, group in enumerate(kv_cache_config.kv_cache_groups):
            for name in group.layer_names:
                self.group_of[name] = g
                self.window_of[name] = getattr(group.kv_cache_spec, "sliding_window", None)
                if type(group.kv_cache_spec).__name__ == "MambaSpec":
                    self.mamba_of[name] = group.kv_cache_spec.mamba_cache_mode
        self.layers = sorted((n for g in kv_cache_config.kv_cache_groups for n in g.layer_names),
                             key=_layer_number)
        self.ctx_of, self.async_scheduling = ctx_of, async_scheduling
        spec_cfg = vllm_config.speculative_config
        self.num_spec = spec_cfg.num_speculative_tokens if spec_cfg else 0
        self.requests, self.in_batch = {}, set()
        self.step, self.forward_context = 0, None
        self.errors, self.excused, self.checked_positions = [], [], 0
        # blocks reported in invalid_block_ids -> their slots not rewritten since
        self.tainted = {}
        self.drafts_accepted = self.drafts_rejected = 0
        self.draft_token_ids = None
        self.connector = V.KVConnectorFactory.create_connector(
            config=vllm_config, role=V.base.KVConnectorRole.WORKER,
            kv_cache_config=kv_cache_config)
        # GPUModelRunner.initialize_kv_cache_tensors: the cross-layer tensor when the
        # connector prefers it and one group allows it (use_uniform_kv_cache), then
        # ActiveKVConnector's registration of one or the other
        if self.connector.prefer_cross_layer_blocks and len(
                kv_cache_config.kv_cache_groups) == 1:
            self.kv_caches, cross = allocate_uniform_kv_caches(kv_cache_config, self.layers)
            self.connector.register_cross_layers_kv_cache(cross, V.FlashAttentionBackend)
        else:
            self.kv_caches = allocate_kv_caches(kv_cache_config, self.layers)
            self.connector.register_kv_caches(self.kv_caches)
        self._attention = V.maybe_transfer_kv_layer(_attention_op)

    # -- vLLM's connector call order --
    def execute_model(self, scheduler_output_bytes):
        so = pickle.loads(scheduler_output_bytes)
        self.step += 1
        _WORKER.worker = self
        try:
            out = self._execute(so)
        finally:
            _WORKER.worker = None
        return pickle.dumps(out)

    def _execute(self, so):
        # GPUModelRunner.execute_model: handle_preemptions first
        assert so.kv_connector_metadata is not None
        self.connector.handle_preemptions(so.kv_connector_metadata)
        self._update_states(so)
        if not so.total_num_scheduled_tokens:
            return V.Mixin.kv_connector_no_forward(so, self.vllm_config)
        step = types.SimpleNamespace(so=so, violations=[], poisoned=set(), poisoned_slots=[],
                                     plan=self._plan(so))
        defer = self.num_spec > 0
        self.mamba_preprocess(step)  # GPUModelRunner: before the connector's start_load_kv
        with set_forward_context(AttentionMetadata(step), self.vllm_config), \
                V.Mixin.maybe_get_kv_connector_output(so, defer_finalize=defer) as kv_out:
            for name in self.layers:
                if name in self.mamba_of:  # no layer hooks: vLLM wraps attention ops only
                    self.mamba_forward(name, step)
                    continue
                # Attention.forward: the new tokens' KV is written (unified_kv_cache_update,
                # FlashAttention's and FlashInfer's way) before the op that
                # maybe_transfer_kv_layer wraps with wait_for_layer_load and save_kv_layer
                self.kv_update(name, step)
                self._attention(None, name)
        invalid = set(kv_out.invalid_block_ids or ()) if kv_out is not None else set()
        for v in step.violations:  # (request, position, block, layer, tainted before)
            (self.excused if v[2] in invalid or v[4] else self.errors).append(v[:4])
        for b in invalid:  # garbage until the forward rewrites each of its slots
            self.tainted[b] = set(range(self.block_size))
        for b, slot in step.poisoned_slots:  # so is what was computed over it
            self.tainted.setdefault(b, set()).add(slot)
        sampled, req_ids = self._sample(so, step)
        if defer:  # sample_tokens: drafting, then the deferred connector finalization
            self._propose_drafts(so, step)
            V.Mixin.finalize_kv_connector()
        if not self.last_stage:  # GPUModelRunner.sample_tokens on a PP rank but the last
            return V.outputs.ModelRunnerOutput.with_kv_conn_output_only(kv_out)
        return V.outputs.ModelRunnerOutput(
            req_ids=req_ids, req_id_to_index={r: i for i, r in enumerate(req_ids)},
            sampled_token_ids=sampled, kv_connector_output=kv_out)

    def _update_states(self, so):
        """GPUModelRunner._update_states' bookkeeping of requests, block tables and
        computed counts (the async spec-decode correction included)."""
        for rid in so.finished_req_ids:
            self.requests.pop(rid, None)
            self.in_batch.discard(rid)
        # vLLM zeroes the step's new blocks (a Mamba hybrid's needs_kv_cache_zeroing) here,
        # after the connector's handle_preemptions and before its start_load_kv: whatever
        # an earlier step's store still read of a reused block is gone from here on.
        if getattr(so, "new_block_ids_to_zero", None):
            self.zero_blocks(so.new_block_ids_to_zero)
        if getattr(so, "kv_cache_block_copies", None):
            raise HarnessError("kv_cache_block_copies (a partial Mamba hit's copy-on-write) "
                               "are not modelled")
        cached = so.scheduled_cached_reqs
        scheduled = set(so.num_scheduled_tokens)
        for rid in self.in_batch - (scheduled - set(cached.resumed_req_ids)):
            self.in_batch.discard(rid)
        for new in so.scheduled_new_reqs:
            self.requests[new.req_id] = _ReqState(
                new.req_id, list(new.prompt_token_ids), len(new.prompt_token_ids),
                [list(g) for g in new.block_ids], new.num_computed_tokens,
                self.ctx_of(new.req_id))
            self.in_batch.add(new.req_id)
        for i, rid in enumerate(cached.req_ids):
            st = self.requests[rid]
            nout, new_ids = cached.num_output_tokens[i], cached.new_block_ids[i]
            in_batch = rid in self.in_batch
            st.num_computed = cached.num_computed_tokens[i]
            if self.async_scheduling and in_batch and st.last_step == self.step - 1:
                # the scheduler counted all drafts of the previous step as accepted
                st.num_computed -= st.last_rejected
            if nout < len(st.tokens) - st.num_prompt:  # discarded outputs
                del st.tokens[st.num_prompt + nout:]
            if rid not in cached.resumed_req_ids:
                if new_ids is not None:
                    for ids, more in zip(st.block_ids, new_ids):
                        ids.extend(more)
            else:
                assert not in_batch and new_ids is not None
                st.block_ids = [list(g) for g in new_ids]
            if rid in cached.all_token_ids:
                known = list(cached.all_token_ids[rid])
                if known != st.tokens[:len(known)]:
                    raise HarnessError("%s: the scheduler's tokens %s are not the worker's %s"
                                       % (rid, known, st.tokens))
            self.in_batch.add(rid)

    def zero_blocks(self, block_ids):
        """GPUModelRunner._zero_block_ids: every page of these blocks, in every KV cache
        tensor (a page is one block of whichever group holds it)."""
        page = attention_spec(self.kv_cache_config).page_size_bytes
        buffers = {id(t.buf): t.buf for t in self.kv_caches.values()}
        for buf in buffers.values():
            if ctypes.sizeof(buf) != page * self.kv_cache_config.num_blocks:
                raise HarnessError("zeroing is modelled for one tensor per layer only")
            for b in block_ids:
                ctypes.memset(ctypes.addressof(buf) + b * page, 0, page)

    def _plan(self, so):
        """Per scheduled request: (state, first position, positions, the tokens at them)."""
        plan = {}
        for rid, n in so.num_scheduled_tokens.items():
            st = self.requests[rid]
            spec = list(so.scheduled_spec_decode_tokens.get(rid, ()))
            k = len(spec)
            # the drafts: the scheduler's (sync), else this worker's own (async placeholders)
            drafts = [d if d >= 0 else (st.drafts[j] if j < len(st.drafts) else -1)
                      for j, d in enumerate(spec)]
            c = st.num_computed
            if c + n - k > len(st.tokens):
                raise HarnessError("%s: positions %d..%d scheduled, %d tokens known"
                                   % (rid, c, c + n - k, len(st.tokens)))
            if k and c + n - k != len(st.tokens):
                raise HarnessError("%s: drafts scheduled inside known tokens" % rid)
            seq = st.tokens[:c + n - k] + drafts
            plan[rid] = types.SimpleNamespace(st=st, c=c, n=n, drafts=drafts, seq=seq,
                                              digests=prefix_digests(st.ctx, seq))
        return plan

    def _slot(self, tensor, block_ids, pos, head, group=0):
        block = block_ids[group][pos // self.block_size]
        return block, tensor.byte_offset((block, head, pos % self.block_size, 0))

    def _layer(self, layer_name):
        """(its KV cache, its index here, the model's layer, bytes per head, a byte view)"""
        t = self.kv_caches[layer_name]
        local = self.layers.index(layer_name)
        assert t.stride(3) == 1
        return (t, local, self.layer0 + local, 2 * self.head_size * self.el,
                memoryview(t.buf).cast("B"))

    def layer_forward(self, layer_name, step):
        """The attention layer: reads the computed KV (checked). A request that read garbage
        computes garbage from the next layer on."""
        t, local, layer, n, mem = self._layer(layer_name)
        group, window = self.group_of[layer_name], self.window_of[layer_name]
        for rid, p in step.plan.items():
            reads = self.reads[rid]
            # a sliding window's first query (position c) reads back to c - window + 1
            for pos in range(max(0, p.c - window + 1) if window else 0, p.c):
                reads.add(pos)
                for h in range(self.num_kv_heads):
                    block, off = self._slot(t, p.st.block_ids, pos, h, group)
                    self.checked_positions += 1
                    if bytes(mem[off:off + n]) != kv_bytes(p.digests[pos], layer,
                                                           self.head0 + h, n):
                        tainted = pos % self.block_size in self.tainted.get(block, ())
                        step.violations.append((rid, pos, block, layer_name, tainted))
                        step.poisoned.add(rid)
                        break

    def kv_update(self, layer_name, step):
        """The layer's KV of the new positions, written before its attention (and so before
        its wait_for_layer_load); poison once an earlier layer read garbage."""
        t, local, layer, n, mem = self._layer(layer_name)
        group = self.group_of[layer_name]
        for rid, p in step.plan.items():
            for pos in range(p.c, p.c + p.n):
                d = p.digests[pos] if rid not in step.poisoned else b"poison%d" % self.step
                for h in range(self.num_kv_heads):
                    block, off = self._slot(t, p.st.block_ids, pos, h, group)
                    mem[off:off + n] = kv_bytes(d, layer, self.head0 + h, n)
                if local == len(self.layers) - 1:
                    slot = pos % self.block_size
                    if rid in step.poisoned:  # computed over garbage: garbage itself
                        step.poisoned_slots.append((block, slot))
                    elif block in self.tainted:
                        self.tainted[block].discard(slot)
                        if not self.tainted[block]:
                            del self.tainted[block]

    def _mamba_layer(self, layer_name):
        """(its group, its mode, the model's layer, bytes of state, a byte view, block id ->
        byte offset of its page)"""
        t = self.kv_caches[layer_name]
        layer = self.layer0 + self.layers.index(layer_name)
        return (self.group_of[layer_name], self.mamba_of[layer_name], layer,
                self.num_kv_heads * MAMBA_STATE * self.el, memoryview(t.buf).cast("B"),
                lambda b: t.byte_offset((b, 0, 0, 0)))

    def _state(self, digest, layer):
        """The recurrent state after the tokens `digest` stands for: this rank's heads."""
        return b"".join(kv_bytes(digest, layer, 128 + self.head0 + h, MAMBA_STATE * self.el)
                        for h in range(self.num_kv_heads))

    @staticmethod
    def _state_block(p, ids, i, group):
        block = ids[i] if i < len(ids) else 0
        if block == 0:
            raise HarnessError("%s: Mamba group %d's state block %d is the null block (%s)"
                               % (p.st.req_id, group, i, ids))
        return block

    def mamba_preprocess(self, step):
        """preprocess_mamba (mamba_cache_mode 'align'): before the step (and its
        start_load_kv), each request's state moves from the block of its last computed
        token to the block its scheduled tokens end in."""
        bs = self.block_size
        for name, mode in self.mamba_of.items():
            if mode != "align":
                continue
            g, _, _, size, mem, offset = self._mamba_layer(name)
            for p in step.plan.values():
                src, dst = (p.c - 1) // bs, cdiv(p.c + p.n, bs) - 1
                if p.c and src != dst:
                    ids = p.st.block_ids[g]
                    a = offset(self._state_block(p, ids, src, g))
                    b = offset(self._state_block(p, ids, dst, g))
                    mem[b:b + size] = bytes(mem[a:a + size])

    def mamba_forward(self, layer_name, step):
        """A Mamba layer: reads the state after the computed tokens (checked: it must be the
        state of exactly that prefix) and writes the state after each block boundary its
        scheduled tokens cross ('all'), and the state after its last scheduled token, into
        the block that token is in ('all': where the next step reads it; 'align': the
        running block, in place)."""
        g, mode, layer, size, mem, offset = self._mamba_layer(layer_name)
        bs = self.block_size
        for rid, p in step.plan.items():
            ids, c, end = p.st.block_ids[g], p.c, p.c + p.n
            if c:
                block = self._state_block(p, ids, cdiv(end if mode == "align" else c, bs) - 1,
                                          g)
                off = offset(block)
                self.checked_positions += 1
                if rid not in step.poisoned and \
                        bytes(mem[off:off + size]) != self._state(p.digests[c - 1], layer):
                    step.violations.append((rid, c - 1, block, layer_name,
                                            block in self.tainted))
                    step.poisoned.add(rid)
            ends = list(range((c // bs + 1) * bs, end + 1, bs)) if mode == "all" else []
            if end not in ends:
                ends.append(end)
            for t in ends:
                block = self._state_block(p, ids, cdiv(t, bs) - 1, g)
                off = offset(block)
                if rid in step.poisoned:
                    mem[off:off + size] = self._state(b"poison%d" % self.step, layer)
                    step.poisoned_slots.append((block, 0))
                else:
                    mem[off:off + size] = self._state(p.digests[t - 1], layer)
                    self.tainted.pop(block, None)

    def _sample(self, so, step):
        """The sampler and rejection sampler: a request whose scheduled tokens end before its
        known tokens (a prefill chunk) samples nothing; else its drafts are accepted while
        they match the model, and the model's next token follows."""
        req_ids, sampled = [], []
        for rid, p in step.plan.items():
            req_ids.append(rid)
            st, k = p.st, len(p.drafts)
            st.last_step, st.last_rejected = self.step, 0
            if p.c + p.n < len(st.tokens):
                sampled.append([])
                continue
            base = st.tokens[:]
            a = 0
            while a < k and p.drafts[a] == next_token(base + p.drafts[:a]):
                a += 1
            new = p.drafts[:a] + [next_token(base + p.drafts[:a])]
            st.tokens.extend(new)
            st.last_rejected = k - a
            self.drafts_accepted += a
            self.drafts_rejected += k - a
            sampled.append(new)
        return sampled, req_ids

    def _propose_drafts(self, so, step):
        """The draft model: num_spec tokens after each request that sampled; how many of
        them are right varies with the length (so some steps accept all, some none)."""
        ids, drafts = [], []
        for rid, p in step.plan.items():
            st = p.st
            toks = list(st.tokens)
            right = (len(toks) * 7 + 3) % (self.num_spec + 1)
            out = []
            for j in range(self.num_spec):
                t = next_token(toks + out)
                out.append(t if j < right else (t + 1 - 10) % VOCAB + 10)
            st.drafts = out
            ids.append(rid)
            drafts.append(out)
        self.draft_token_ids = V.outputs.DraftTokenIds(ids, drafts)

    def take_draft_token_ids(self):
        d, self.draft_token_ids = self.draft_token_ids, None
        return pickle.dumps(d)

    def shutdown(self):
        self.connector.shutdown()


def _layer_number(name):
    """The model's index of a layer named model.layers.<i>....: the order of its hooks."""
    parts = name.split(".")
    return int(parts[2]) if len(parts) > 2 and parts[2].isdigit() else 0


def _attention_op(query, layer_name):
    """The attention custom op (unified_attention_with_output's place): writes this layer's
    KV of the step's scheduled tokens; vLLM's maybe_transfer_kv_layer wraps it."""
    w = _active_worker()
    w.layer_forward(layer_name, w.forward_context.attn_metadata.step)


# ---------------------------------------------------------------------------------------
# N workers: one process per rank, as MultiprocExecutor runs them
# ---------------------------------------------------------------------------------------

MAMBA_STATE = 20  # float16s per KV head in a Mamba layer's state


def rank_kv_cache_config(rank, num_gpu_blocks, block_size, num_kv_heads, head_size, layers,
                         tp=1, pp=1, sliding_window=None, mamba=None, mamba_groups=1,
                         mamba_first=False):
    """A rank's KVCacheConfig as vLLM builds it per worker: under TP its spec has the rank's
    share of the KV heads (num_kv_heads // tp), under PP its tensors and group only the
    rank's stage's layers; every rank has the same num_blocks. Returns (the config, the
    model's index of its first layer, of its first KV head, whether it is the last PP
    stage). TP rank = rank % tp, PP rank = rank // tp (the multiproc executor's numbering).
    sliding_window: a hybrid model as vLLM's hybrid KV cache manager groups it: every other
    layer (the odd ones) attends within that many tokens (SlidingWindowSpec, KV cache group
    1), the others fully (group 0), and tensor i is shared by layer i of each group (vLLM's
    _get_kv_cache_config_from_groups). mamba: a Mamba hybrid instead, its mamba_cache_mode
    ("all" or "align"): the odd layers are Mamba layers (MambaSpec, group 1, their state
    sharded over TP by heads and its page padded to the attention page, as vLLM unifies
    them). mamba_groups k: every (k + 1)-th layer from 0 attends, the others are Mamba in k
    groups of as many layers (tensor i shared by the i-th layer of every group);
    mamba_first: the Mamba groups come before the attention group, as in Jamba's and
    Nemotron-H's configs."""
    torch = sys.modules["torch"]
    kci = V.kv_cache_interface
    tp_rank, pp_rank = rank % tp, rank // tp
    if num_kv_heads % tp or len(layers) % pp:
        raise HarnessError("%d KV heads, %d layers do not split over TP %d, PP %d"
                           % (num_kv_heads, len(layers), tp, pp))
    heads, per_stage = num_kv_heads // tp, len(layers) // pp
    mine = list(layers[pp_rank * per_stage:(pp_rank + 1) * per_stage])
    spec = kci.FullAttentionSpec(block_size=block_size, num_kv_heads=heads,
                                 head_size=head_size, dtype=torch.float16)
    if sliding_window is not None or mamba is not None:
        n = 1 + (mamba_groups if mamba is not None else 1)
        if len(mine) % n:
            raise HarnessError("the hybrid layout takes a multiple of %d layers per stage" % n)
        if mamba is not None:
            other = kci.MambaSpec(block_size=block_size, shapes=((heads, MAMBA_STATE),),
                                dtypes=(torch.float16,),
                                page_size_padded=spec.page_size_bytes,
                                mamba_cache_mode=mamba)
        else:
            other = kci.SlidingWindowSpec(block_size=block_size, num_kv_heads=heads,
                                        head_size=head_size, dtype=torch.float16,
                                        sliding_window=sliding_window)
        assert other.page_size_bytes == spec.page_size_bytes
        members = [mine[p::n] for p in range(n)]  # [0]: attention, then the other groups
        groups = [kci.KVCacheGroupSpec(members[0], spec)] + [
            kci.KVCacheGroupSpec(m, other) for m in members[1:]]
        if mamba_first:
            groups = groups[1:] + groups[:1]
        cfg = kci.KVCacheConfig(
            num_blocks=num_gpu_blocks,
            kv_cache_tensors=[kci.KVCacheTensor(size=spec.page_size_bytes * num_gpu_blocks,
                                                shared_by=list(names))
                              for names in zip(*members)],
            kv_cache_groups=groups)
        return cfg, pp_rank * per_stage, tp_rank * heads, pp_rank == pp - 1
    cfg = kci.KVCacheConfig(
        num_blocks=num_gpu_blocks,
        kv_cache_tensors=[kci.KVCacheTensor(size=spec.page_size_bytes * num_gpu_blocks,
                                            shared_by=[name]) for name in mine],
        kv_cache_groups=[kci.KVCacheGroupSpec(mine, spec)])
    return cfg, pp_rank * per_stage, tp_rank * heads, pp_rank == pp - 1


def _rank_main(conn, params):
    """A worker process (spawned: a fresh interpreter): sets vLLM up, builds its rank's
    VllmConfig (parallel_config.rank = its rank, as WorkerBase sets it) and KV caches, its
    Worker (whose connector vLLM's factory builds with role WORKER), then serves the parent's
    requests. Only bytes cross the pipe: pickles in both directions, and within them the
    SchedulerOutput and ModelRunnerOutput pickled as vLLM's message queues pickle them."""
    import traceback
    worker = None
    try:
        p = pickle.loads(params)
        setup()
        cfg = make_vllm_config(p["extra"], rank=p["rank"], **p["config"])
        kcc, layer0, head0, last = rank_kv_cache_config(rank=p["rank"], **p["shape"])
        ctx = {}
        worker = Worker(cfg, kcc, ctx.__getitem__, p["config"]["async_scheduling"],
                        layer0=layer0, head0=head0, last_stage=last)
        conn.send_bytes(pickle.dumps(("ok", None)))
    except BaseException:  # noqa: BLE001 - reported to the parent, which raises it
        conn.send_bytes(pickle.dumps(("error", traceback.format_exc())))
        return
    while True:
        try:
            op, args = pickle.loads(conn.recv_bytes())
        except EOFError:  # the parent is gone
            op, args = "close", ()
        try:
            if op == "execute":
                so_bytes, new_ctx = args
                ctx.update(new_ctx)
                res = worker.execute_model(so_bytes)
            elif op == "drafts":
                res = worker.take_draft_token_ids()
            elif op == "query":
                res = {name: getattr(worker, name) for name in args}
            elif op == "close":
                worker.shutdown()
                res = None
            else:
                raise HarnessError("unknown op %r" % (op,))
            reply = ("ok", res)
        except BaseException:  # noqa: BLE001 - reported to the parent, which raises it
            reply = ("error", traceback.format_exc())
        try:
            conn.send_bytes(pickle.dumps(reply))
        except (BrokenPipeError, OSError):
            return
        if op == "close":
            return


class WorkerProc:
    """One rank's process (multiprocessing's "spawn" context, never fork: this process has
    kvtier's threads) and its pipe."""

    TIMEOUT = 120.0

    def __init__(self, rank, params):
        import multiprocessing
        mp = multiprocessing.get_context("spawn")
        self.rank = rank
        self.conn, child = mp.Pipe()
        self.proc = mp.Process(target=_rank_main, args=(child, pickle.dumps(params)),
                               name="kvtier-rank-%d" % rank, daemon=True)
        self.proc.start()
        child.close()
        self.ready = False

    def send(self, op, *args):
        self.conn.send_bytes(pickle.dumps((op, args)))

    def recv(self, timeout=None):
        if not self.conn.poll(self.TIMEOUT if timeout is None else timeout):
            raise HarnessError("rank %d did not answer in time (alive: %s)"
                               % (self.rank, self.proc.is_alive()))
        try:
            status, value = pickle.loads(self.conn.recv_bytes())
        except EOFError:
            raise HarnessError("rank %d exited (code %s)" % (self.rank, self.proc.exitcode))
        if status != "ok":
            raise AssertionError("rank %d failed:\n%s" % (self.rank, value))
        return value

    def call(self, op, *args):
        self.send(op, *args)
        return self.recv()

    def close(self):
        try:
            if self.proc.is_alive():
                self.send("close")
                self.recv(timeout=30)
        finally:
            self.proc.join(10)
            if self.proc.is_alive():
                self.proc.kill()
                self.proc.join(5)
            self.conn.close()


class WorkerGroup:
    """N ranks as MultiprocExecutor runs them with a KV connector: the SchedulerOutput is
    pickled once and every rank unpickles its own copy (the broadcast queue); every rank
    replies, and vLLM's own KVOutputAggregator (compiled from kv_connector/utils.py, built
    by from_connector over the scheduler's connector) merges their KVConnectorOutputs into
    the output of output_rank = world_size - TP (TP rank 0 of the last PP stage).

    rank_outputs: per execution, each rank's own KVConnectorOutput (None for an empty one),
    kept before aggregate replaces the output rank's; aggregated: the merged ones."""

    def __init__(self, extra, config, shape, ctx, rank_manager):
        self.tp, self.pp = shape["tp"], shape["pp"]
        self.world = self.tp * self.pp
        self.output_rank = self.world - self.tp
        self.num_spec = config["num_spec_tokens"]
        self._ctx, self._ctx_sent = ctx, set()
        self.aggregator = None
        self.rank_outputs, self.aggregated = [], []
        self.procs = []
        try:
            for rank in range(self.world):
                mine = copy.deepcopy(dict(extra))
                if rank in rank_manager:
                    mine["manager"] = dict(mine.get("manager") or {}, **rank_manager[rank])
                self.procs.append(WorkerProc(rank, dict(
                    extra=mine, config=config, shape=shape, rank=rank)))
        except BaseException:
            self.shutdown()
            raise

    def start(self, aggregator):
        """Waits for every rank to be up (their connectors registered their KV caches)."""
        self.aggregator = aggregator
        for p in self.procs:
            p.recv()
            p.ready = True

    def execute_model(self, scheduler_output_bytes):
        new = {k: v for k, v in self._ctx.items() if k not in self._ctx_sent}
        self._ctx_sent.update(new)
        for p in self.procs:  # the broadcast: all ranks run the step at once
            p.send("execute", scheduler_output_bytes, new)
        outputs = [pickle.loads(p.recv()) for p in self.procs]
        self.rank_outputs.append([getattr(o, "kv_connector_output", None) for o in outputs])
        out = self.aggregator.aggregate(outputs, output_rank=self.output_rank)
        self.aggregated.append(out.kv_connector_output if out is not None else None)
        return pickle.dumps(out)

    def take_draft_token_ids(self):
        return self.procs[self.output_rank].call("drafts")

    def query(self, *names):
        """Per rank, {name: the value of the Worker's attribute}."""
        for p in self.procs:
            p.send("query", *names)
        return [p.recv() for p in self.procs]

    @property
    def errors(self):
        return [(q_rank,) + tuple(e) for q_rank, q in enumerate(self.query("errors"))
                for e in q["errors"]]

    def shutdown(self):
        procs, self.procs = self.procs, []
        failure = None
        for p in procs:
            try:
                if p.ready:
                    p.close()
                else:  # it may still be setting up: no pipe protocol yet
                    p.proc.kill()
                    p.proc.join(5)
                    p.conn.close()
            except BaseException as e:  # noqa: BLE001 - close the others first
                failure = failure or e
        if failure is not None:
            raise failure


# ---------------------------------------------------------------------------------------
# The engine core: EngineCore.step, and step_with_batch_queue (async scheduling, or PP)
# ---------------------------------------------------------------------------------------

class Engine:
    """vLLM's engine core around the compiled Scheduler (AsyncScheduler with async
    scheduling, vLLM's default) and one Worker, as UniProcExecutor runs it (one worker, its
    ModelRunnerOutput passed on as is, across a pickle); with tp * pp > 1, N worker processes
    (WorkerGroup: MultiprocExecutor's broadcast and vLLM's own KVOutputAggregator), and
    step_with_batch_queue whenever vLLM's max_concurrent_batches > 1 (PP too, as EngineCore
    does). rank_manager {rank: {kvt_manager_config field: value}} is a test device: that
    rank's kv_connector_extra_config "manager" gets the fields (real vLLM gives every rank
    the same config), e.g. G3 fault injection on one rank. Requests are vLLM's Request with vLLM's
    block hasher (get_request_block_hasher over sha256, init_none_hash as EngineCore does).
    The model's KV depends on the tokens and on the request's LoRA and cache_salt (standing
    for tenant-specific weights, so that a cross-tenant hit shows in the bytes too)."""

    LAYERS = ("model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn")

    def __init__(self, extra, *, async_scheduling=True, block_size=16, num_gpu_blocks=40,
                 num_kv_heads=4, head_size=8, max_model_len=1024, max_num_batched_tokens=256,
                 max_num_seqs=8, num_spec_tokens=0, kv_events=True,
                 kv_load_failure_policy="recompute", long_prefill_token_threshold=0,
                 layers=LAYERS, tp=1, pp=1, rank_manager=None, sliding_window=None,
                 mamba=None, mamba_groups=1, mamba_first=False):
        setup()
        config = dict(
            async_scheduling=async_scheduling, block_size=block_size,
            num_gpu_blocks=num_gpu_blocks, max_model_len=max_model_len,
            max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
            num_spec_tokens=num_spec_tokens, kv_events=kv_events,
            kv_load_failure_policy=kv_load_failure_policy,
            long_prefill_token_threshold=long_prefill_token_threshold,
            tensor_parallel_size=tp, pipeline_parallel_size=pp,
            mamba_cache_mode=mamba or "none")
        self.cfg = make_vllm_config(extra, **config)
        self.world, self.tp, self.pp = tp * pp, tp, pp
        shape = dict(num_gpu_blocks=num_gpu_blocks, block_size=block_size,
                     num_kv_heads=num_kv_heads, head_size=head_size, layers=list(layers),
                     tp=tp, pp=pp, sliding_window=sliding_window, mamba=mamba,
                     mamba_groups=mamba_groups, mamba_first=mamba_first)
        self.ctx = {}
        if self.world > 1:  # the workers start first (spawned: they set vLLM up meanwhile)
            self.worker = WorkerGroup(extra, config, shape, self.ctx, rank_manager or {})
        # the scheduler's KVCacheConfig is worker 0's (vLLM's EngineCore)
        self.kv_cache_config = rank_kv_cache_config(rank=0, **shape)[0]
        self.async_scheduling = async_scheduling
        hash_fn = V.hashing.get_hash_fn_by_name(self.cfg.cache_config.prefix_caching_hash_algo)
        V.kv_cache_utils.init_none_hash(hash_fn)
        self.block_hasher = V.kv_cache_utils.get_request_block_hasher(block_size, hash_fn)
        if self.world == 1:
            self.worker = Worker(self.cfg, self.kv_cache_config, self.ctx.__getitem__,
                                 async_scheduling)
        cls = V.AsyncScheduler if async_scheduling else V.Scheduler
        try:
            self.sched = cls(vllm_config=self.cfg, kv_cache_config=self.kv_cache_config,
                             structured_output_manager=StructuredOutputManager(),
                             block_size=block_size, log_stats=False)
            if self.world > 1:  # Executor.init_kv_output_aggregator(scheduler.connector)
                self.worker.start(V.KVOutputAggregator.from_connector(self.sched.connector,
                                                                      self.world))
        except BaseException:
            self.worker.shutdown()
            raise
        self.connector = self.sched.connector
        self.batch_queue = deque()
        # EngineCore: step_with_batch_queue whenever max_concurrent_batches > 1 (async
        # scheduling, or PP > 1 even with sync scheduling)
        self.batch_queue_size = self.cfg.max_concurrent_batches
        self.requests, self.outputs, self.finish_reasons = {}, defaultdict(list), {}
        # request -> (GPU hit, kvtier hit) of its first admission, and of each lookup since
        self.aborted, self.hits, self.hit_log, self.steps = set(), {}, defaultdict(list), 0
        self.scheduler_outputs = []  # (step, SchedulerOutput) of every schedule()
        self.ahead = 0  # scheduled requests whose computed count ran past their known tokens
        self.kv_outputs = []  # (step, KVConnectorOutput) reaching update_from_output
        self.status_log = defaultdict(list)  # request -> its statuses after each schedule()
        self.after_execute = None  # a hook: called between execution and update_from_output
        self.closed = False

    # -- requests --
    def add_request(self, req_id, prompt, max_tokens=4, cache_salt=None, lora=None):
        lora_request = LoRARequest(lora, 1 + sum(map(ord, lora))) if lora else None
        self.ctx[req_id] = (cache_salt, lora)
        r = V.Request(request_id=req_id, prompt_token_ids=list(prompt),
                      sampling_params=SamplingParams(max_tokens=max_tokens),
                      pooling_params=None, cache_salt=cache_salt, lora_request=lora_request,
                      block_hasher=self.block_hasher)
        self.requests[req_id] = r
        self.sched.add_request(r)
        return r

    def abort(self, *req_ids):
        """EngineCore.abort_requests: the scheduler finishes them as FINISHED_ABORTED."""
        self.aborted.update(req_ids)
        return self.sched.finish_requests(list(req_ids), V.RequestStatus.FINISHED_ABORTED)

    # -- stepping --
    def has_work(self):
        return self.sched.has_requests() or bool(self.batch_queue)

    def _execute(self, so):
        self.scheduler_outputs.append((self.steps, so))
        for rid in so.num_scheduled_tokens:  # scheduled past the tokens vLLM knows
            r = self.sched.requests[rid]
            self.ahead += r.num_computed_tokens > r.num_tokens
        for rid, r in self.sched.requests.items():
            log = self.status_log[rid]
            if not log or log[-1] != r.status.name:
                log.append(r.status.name)
        for rid, r in self.sched.requests.items():  # the prefix hits vLLM recorded
            ps = r.prefill_stats
            if ps is not None and ps.num_external_cached_tokens is not None:
                hit = (ps.num_local_cached_tokens, ps.num_external_cached_tokens)
                self.hits.setdefault(rid, hit)
                if self.hit_log[rid][-1:] != [hit]:
                    self.hit_log[rid].append(hit)
        return pickle.loads(self.worker.execute_model(pickle.dumps(so)))

    def _update(self, so, out):
        kvo = out.kv_connector_output
        if kvo is not None:
            self.kv_outputs.append((self.steps, kvo))
        if self.after_execute is not None:
            hook, self.after_execute = self.after_execute, None
            hook(self)
        for outs in self.sched.update_from_output(so, out).values():
            for o in outs.outputs:
                self.outputs[o.request_id].extend(o.new_token_ids)
                if o.finish_reason is not None:
                    self.finish_reasons[o.request_id] = o.finish_reason

    def step(self):
        """One engine-core iteration."""
        self.steps += 1
        if self.batch_queue_size <= 1:  # EngineCore.step, then post_step's drafts
            if not self.sched.has_requests():
                return False
            so = self.sched.schedule()
            out = self._execute(so)
            self._update(so, out)
            if so.total_num_scheduled_tokens > 0 and self.worker.num_spec:
                drafts = pickle.loads(self.worker.take_draft_token_ids())
                if drafts is not None:
                    self.sched.update_draft_token_ids(drafts)
            return True
        # EngineCore.step_with_batch_queue: schedule the next batch before the previous
        # one's output is processed (the previous batch is taken as not done yet)
        if self.sched.has_requests():
            so = self.sched.schedule()
            out = self._execute(so)
            executed = so.total_num_scheduled_tokens > 0
            self.batch_queue.appendleft((so, out))
            if executed and len(self.batch_queue) < self.batch_queue_size:
                return True
        elif not self.batch_queue:
            return False
        so, out = self.batch_queue.pop()
        self._update(so, out)
        return True

    def run(self, until=None, max_steps=20000, timeout=60.0):
        """Steps until `until(self)` (default: no work left), as vLLM's busy loop does; no
        sleeps: the worker's transfers run on kvtier's threads meanwhile."""
        deadline = time.monotonic() + timeout
        for _ in range(max_steps):
            if until(self) if until else not self.has_work():
                return
            self.step()
            if time.monotonic() > deadline:
                break
        raise AssertionError("engine did not get there in %d steps: requests %s, waiting "
                             "for remote KV %s" % (self.steps, self.states(), sorted(
                                 r.request_id for r in self.sched.skipped_waiting)))

    def pause(self):
        """pause_generation(mode="keep"): the scheduler schedules nothing (PAUSED_ALL) and the
        engine steps until the batches in flight are processed; resume() undoes it."""
        self.sched.set_pause_state(PauseState.PAUSED_ALL)
        self.run(lambda e: not e.batch_queue)

    def resume(self):
        self.sched.set_pause_state(PauseState.UNPAUSED)

    def run_hook(self, hook, **kw):
        """Sets a hook for the next update_from_output (what vLLM's engine does between a
        batch's execution and the processing of its output, e.g. _process_aborts_queue) and
        steps until it ran."""
        self.after_execute = hook
        self.run(lambda e: e.after_execute is None, **kw)

    def run_until_finished(self, *req_ids, **kw):
        self.run(lambda e: all(e.requests[r].is_finished() for r in req_ids), **kw)

    def states(self):
        return {rid: r.status.name for rid, r in self.sched.requests.items()}

    # -- checks --
    def assert_drained(self):
        """vLLM's state once everything finished: no request left anywhere, every GPU
        block back in the pool, the worker's forward never read wrong KV."""
        s = self.sched
        assert s.requests == {}, "requests left in vLLM: %s" % self.states()
        assert not s.running and not s.waiting and not s.skipped_waiting
        assert not s.finished_recving_kv_req_ids and not s.failed_recving_kv_req_ids
        pool = s.kv_cache_manager.block_pool
        assert pool.get_num_free_blocks() == pool.num_gpu_blocks - 1, "GPU blocks leaked"
        mgr = s.kv_cache_manager.coordinator.single_type_managers[0]
        assert not mgr.req_to_blocks, "block tables left: %s" % dict(mgr.req_to_blocks)
        self.assert_bytes()

    def assert_bytes(self):
        assert not self.worker.errors, (
            "the forward read KV that is not what the model wrote for that prefix (request, "
            "position, block, layer), first of %d: %s" % (len(self.worker.errors),
                                                         self.worker.errors[:5]))

    def assert_outputs(self, *req_ids):
        """The generated tokens are the model's greedy continuation."""
        for rid in req_ids:
            r = self.requests[rid]
            want = expected_output(r.prompt_token_ids, len(self.outputs[rid]))
            assert self.outputs[rid] == want, "%s generated %s, the model says %s" % (
                rid, self.outputs[rid], want)

    def events(self):
        """The KV events vLLM's scheduler published (from the connector's take_events)."""
        pub = self.sched.kv_event_publisher
        return [e for batch in getattr(pub, "batches", ()) for e in batch.events]

    def close(self):
        if self.closed:
            return
        self.closed = True
        try:
            self.worker.shutdown()
        finally:
            self.sched.shutdown()


# ---------------------------------------------------------------------------------------
# What the test modules share
# ---------------------------------------------------------------------------------------

def prompt(seed, n):
    """n tokens of a prompt that differs with seed."""
    return [10 + (seed * 7919 + i * 104729 + (i * i) % 13) % 1000 for i in range(n)]


@contextlib.contextmanager
def engines(tmp_path, **fixed):
    """A factory of Engines, closed on exit: factory(engine=dict(...), **extra) is an
    Engine with `fixed` and then `engine` as its arguments, and kv_connector_extra_config
    g2_blocks 64 and g3_path tmp_path unless `extra` gives them."""
    made = []

    def factory(engine=None, **extra):
        e = Engine(dict(dict(g2_blocks=64, g3_path=str(tmp_path)), **extra),
                   **dict(fixed, **(engine or {})))
        made.append(e)
        return e

    try:
        yield factory
    finally:
        for e in made:
            e.close()


def assert_hits_match_vllms(manager, spec, sliding_window, seed, keeps, trials=200):
    """kvtier's hit, with the connector's sliding_window, equals vLLM's own
    manager.find_longest_cache_hit (vLLM's GPU prefix cache standing for kvtier's G2) over
    `trials` random sets of present blocks of 12 full ones, each block present with a
    probability drawn from `keeps`. Returns the set of hit lengths seen."""
    import random

    import kvtier
    hash_fn = V.hashing.get_hash_fn_by_name("sha256")
    V.kv_cache_utils.init_none_hash(hash_fn)
    bs = spec.block_size
    tokens = prompt(9, 12 * bs + 5)
    request = V.Request(request_id="r", prompt_token_ids=tokens,
                        sampling_params=SamplingParams(max_tokens=1), pooling_params=None,
                        block_hasher=V.kv_cache_utils.get_request_block_hasher(bs, hash_fn))
    ours = kvtier.hash_sequence(tokens, bs)
    rng = random.Random(seed)
    seen = set()
    for _ in range(trials):
        keep = rng.choice(keeps)
        present = [j for j in range(len(ours)) if rng.random() < keep]
        pool = BlockPoolStandIn(64, True, bs)
        for j in present:
            blk = pool.blocks[j + 1]
            key = V.kv_cache_utils.make_block_hash_with_group_id(request.block_hashes[j], 1)
            blk.set_block_hash(key, (j + 1) * bs)
            pool.cached_block_hash_to_block[key] = {blk.block_id: blk}
        _, theirs = manager.find_longest_cache_hit(
            request.block_hashes, len(tokens) - 1, [1], pool, spec, False, bs)
        with kvtier.Manager(page_size=bs, num_layers=1, num_outer=1, chunk_bytes=0,
                            g1_blocks=1, g2_blocks=64) as m, \
                kvtier.Connector(m, role=kvtier.ROLE_SCHEDULER, num_gpu_blocks=64,
                                 sliding_window=sliding_window) as c:
            for j in present:
                m.release(m.register_hashes(m.alloc(1, kvtier.G2), [ours[j]],
                                            parent=ours[j - 1] if j else 0))
            mine, _ = c.get_num_new_matched_tokens("r", tokens, 0)
        assert mine == theirs, "present %s: kvtier %d, vLLM %d" % (present, mine, theirs)
        seen.add(theirs)
    return seen
