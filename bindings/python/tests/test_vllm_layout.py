"""kvtier._vllm_layout against KV caches built the way vLLM builds them: allocated flat,
viewed with the logical shape permuted by the backend's stride order, permuted back.
FlashAttention's shapes and stride orders come from vLLM's own flash_attn.py (VLLM_SRC);
FlashInfer's, the older (2, num_blocks, ...) FlashAttention's and MLA's are written here.
Every chunk the layout addresses is read back and must hold exactly the elements of its block
(and outer index) as vLLM's attention addresses them, through the logical view."""
import array
import ast
import ctypes
import itertools
import math
import os
import types

import pytest

from test_connector import seed  # puts kvtier on sys.path
import kvtier  # noqa: E402
from kvtier import _vllm_layout as vl  # noqa: E402

CPU = types.SimpleNamespace(type="cpu", index=None)
BLOCKS, PAGE, HEAD = 5, 16, 8  # 5 blocks: a size no other dim has


class Tensor:
    """A stand-in for torch.Tensor: a strided view of 2-byte elements over a ctypes buffer,
    with what _vllm_layout reads (data_ptr, stride, shape, element_size, numel, device)."""

    def __init__(self, buf, shape, strides, offset=0, device=CPU):
        self.buf, self.shape, self._strides = buf, tuple(shape), tuple(strides)
        self._offset, self.device = offset, device

    @classmethod
    def vllm(cls, shape, stride_order=None, page=None):
        """As vLLM's _reshape_attention_kv_cache: a flat buffer viewed with the shape permuted
        by stride_order, then permuted back. page: the blocks' stride in elements when pages
        are padded (logical dim 0 is the blocks)."""
        order = stride_order or tuple(range(len(shape)))
        physical = [shape[i] for i in order]
        strides = [math.prod(physical[i + 1:]) for i in range(len(physical))]
        if page:
            strides[order.index(0)] = page
        buf = (ctypes.c_uint16 * (page * shape[0] if page else math.prod(shape)))()
        return cls(buf, shape, [strides[order.index(d)] for d in range(len(shape))])

    def permute(self, *dims):
        return Tensor(self.buf, [self.shape[d] for d in dims],
                      [self._strides[d] for d in dims], self._offset, self.device)

    def __getitem__(self, i):
        return Tensor(self.buf, self.shape[1:], self._strides[1:],
                      self._offset + i * self._strides[0], self.device)

    def data_ptr(self):
        return ctypes.addressof(self.buf) + 2 * self._offset

    def stride(self, d):
        return self._strides[d]

    def element_size(self):
        return 2

    def numel(self):
        return math.prod(self.shape)

    def indices(self):
        return itertools.product(*(range(n) for n in self.shape))

    def at(self, index):
        """The index in buf of the element at a logical index."""
        return self._offset + sum(i * s for i, s in zip(index, self._strides))

    def fill(self, first=1):
        """Element i in logical row-major order := first + i (unique while < 65536)."""
        assert first + self.numel() <= 65536
        for i, index in enumerate(self.indices()):
            self.buf[self.at(index)] = first + i

    def get(self, index):
        return self.buf[self.at(index)]


def layers(shape, order=None, page=None, fill=True):
    """Two layers' caches, filled with values unique across them."""
    caches = {}
    for layer in range(2):
        t = Tensor.vllm(shape, order, page)
        if fill:
            t.fill(1 + layer * t.numel())
        caches["model.layers.%d.self_attn.attn" % layer] = t
    return caches


def check(tensors, block_dim, outer_dims, num_blocks, result, k=1):
    """Each chunk result addresses holds exactly its block's (and outer index's) elements of
    the tensor of the same name; chunks do not overlap; each base reaches its last block.
    k: block_dim holds num_blocks * k kernel blocks, block b being kernel blocks
    b*k .. b*k+k-1."""
    names, num_outer, chunk_bytes, layout = result
    assert names == list(tensors)
    assert len(layout.bases) == len(layout.strides) == len(names) * num_outer
    spans = []
    for l, name in enumerate(names):
        t = tensors[name]
        want = {}  # (block, outer index) -> sorted elements
        for index in t.indices():
            key = (index[block_dim] // k, tuple(index[d] for d in outer_dims))
            want.setdefault(key, []).append(t.get(index))
        outers = list(itertools.product(*(range(t.shape[d]) for d in outer_dims)))
        assert num_outer == len(outers)
        for o, outer in enumerate(outers):
            (address, length), stride = layout.bases[l * num_outer + o], layout.strides[
                l * num_outer + o]
            assert stride >= chunk_bytes
            assert length >= (num_blocks - 1) * stride + chunk_bytes
            for b in range(num_blocks):
                start = address + b * stride
                got = array.array("H", ctypes.string_at(start, chunk_bytes))
                assert sorted(got) == sorted(want[(b, outer)]), (name, outer, b)
                spans.append((start, start + chunk_bytes))
    spans.sort()
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))


# ---- vLLM's FlashAttention, from its source ----

@pytest.fixture(scope="module")
def flash_attn():
    """layout -> FlashAttentionBackend's get_kv_cache_shape and get_kv_cache_stride_order,
    compiled alone from $VLLM_SRC/vllm/v1/attention/backends/flash_attn.py."""
    src = os.environ.get("VLLM_SRC")
    if not src:
        pytest.skip("VLLM_SRC is not set: FlashAttention's KV layouts are read from vLLM's "
                    "source (tools/test.sh sets VLLM_SRC=../shared/vllm)")
    path = os.path.join(src, "vllm", "v1", "attention", "backends", "flash_attn.py")
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    backend, = (n for n in tree.body
                if isinstance(n, ast.ClassDef) and n.name == "FlashAttentionBackend")
    wanted = ("get_kv_cache_shape", "get_kv_cache_stride_order")
    fns = [n for n in backend.body if isinstance(n, ast.FunctionDef) and n.name in wanted]
    assert sorted(f.name for f in fns) == sorted(wanted), path
    for f in fns:
        f.decorator_list = []  # @staticmethod: plain functions here
    code = compile(ast.Module(body=fns, type_ignores=[]), path, "exec")

    def load(layout):
        # A stub of vllm.v1.attention.backends.utils.get_kv_cache_layout: the layout vLLM
        # picks (NHD unless a connector requires another).
        ns = {"get_kv_cache_layout": lambda: layout}
        exec(code, ns)
        return types.SimpleNamespace(shape=ns["get_kv_cache_shape"],
                                     stride_order=ns["get_kv_cache_stride_order"])
    return load


@pytest.mark.parametrize("heads", [1, 4])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_flash_attention(flash_attn, layout, heads):
    fa = flash_attn(layout)
    caches = layers(fa.shape(BLOCKS, PAGE, heads, HEAD), fa.stride_order())
    result = vl.g1_layout(caches, BLOCKS)
    assert result[1:3] == (1, heads * PAGE * 2 * HEAD * 2)  # K and V of a block: one chunk
    check(caches, 0, (), BLOCKS, result)


def test_flash_attention_padded_pages(flash_attn):
    """vLLM's page_size_padded: a strided view whose blocks lie further apart."""
    fa = flash_attn("NHD")
    shape = fa.shape(BLOCKS, PAGE, 4, HEAD)
    caches = layers(shape, fa.stride_order(), page=math.prod(shape[1:]) + 24)
    result = vl.g1_layout(caches, BLOCKS)
    assert result[3].strides == [(math.prod(shape[1:]) + 24) * 2] * 2
    check(caches, 0, (), BLOCKS, result)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_cross_layer(flash_attn, layout):
    """allocate_uniform_kv_caches: (num_layers,) + shape, the include_num_layers_dimension
    order; vLLM registers the tensor in memory order, and binds the layers' views of it,
    which g1_layout takes too where a layer's block is contiguous (NHD)."""
    fa, num_layers = flash_attn(layout), 3
    order = fa.stride_order(include_num_layers_dimension=True)
    logical = Tensor.vllm((num_layers,) + fa.shape(BLOCKS, PAGE, 4, HEAD), order)
    logical.fill()
    block = num_layers * 4 * PAGE * 2 * HEAD * 2
    for kv_cache in (logical.permute(*order), logical):
        result = vl.cross_layer_layout(kv_cache, BLOCKS)
        assert result[:3] == ([vl.ALL_LAYERS], 1, block)
        check({vl.ALL_LAYERS: logical}, 1, (), BLOCKS, result)
    views = {"layer%d" % i: logical[i] for i in range(num_layers)}
    if layout == "HND":  # (blocks, heads, layers, ...): a layer's heads lie apart
        with pytest.raises(ValueError, match="layer layer0: .*a block is not contiguous"):
            vl.g1_layout(views, BLOCKS)
        return
    result = vl.g1_layout(views, BLOCKS)  # a layer's chunks interleave with the others'
    assert result[1:3] == (1, block // num_layers) and result[3].strides == [block] * 3
    check(views, 0, (), BLOCKS, result)


# ---- kernel blocks: the attention kernel's block size is block_size / k ----
# gpu_model_runner (_reshape_kv_cache_tensors) and allocate_uniform_kv_caches build the
# backend's shape with kernel_num_blocks = num_blocks * k blocks of kernel_block_size tokens.

@pytest.mark.parametrize("k", [2, 4])
@pytest.mark.parametrize("heads", [1, 4])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_flash_attention_kernel_blocks(flash_attn, layout, heads, k):
    fa = flash_attn(layout)
    caches = layers(fa.shape(BLOCKS * k, PAGE, heads, HEAD), fa.stride_order())
    result = vl.g1_layout(caches, BLOCKS)
    kernel_block = heads * PAGE * 2 * HEAD * 2
    assert result[1:3] == (1, k * kernel_block)  # k kernel blocks of K and V: one chunk
    assert result[3].strides == [k * kernel_block] * 2
    check(caches, 0, (), BLOCKS, result, k)


@pytest.mark.parametrize("k", [2, 4])
def test_kernel_blocks_kv_first(k):
    """The older (2, num_blocks * k, block_size, num_kv_heads, head_size): each of K and V
    is an outer chunk of k kernel blocks."""
    caches = layers((2, BLOCKS * k, PAGE, 4, HEAD))
    result = vl.g1_layout(caches, BLOCKS)
    assert result[1:3] == (2, k * PAGE * 4 * HEAD * 2)
    assert result[3].strides == [k * PAGE * 4 * HEAD * 2] * 4
    check(caches, 1, (0,), BLOCKS, result, k)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_cross_layer_kernel_blocks(flash_attn, layout):
    fa, num_layers, k = flash_attn(layout), 3, 2
    order = fa.stride_order(include_num_layers_dimension=True)
    logical = Tensor.vllm((num_layers,) + fa.shape(BLOCKS * k, PAGE, 4, HEAD), order)
    logical.fill()
    result = vl.cross_layer_layout(logical.permute(*order), BLOCKS)
    assert result[:3] == ([vl.ALL_LAYERS], 1, k * num_layers * 4 * PAGE * 2 * HEAD * 2)
    check({vl.ALL_LAYERS: logical}, 1, (), BLOCKS, result, k)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_a_dim_inside_a_kernel_block_may_have_the_blocks_size(flash_attn, layout):
    """4 blocks of 2 kernel blocks with 4 heads: the heads are not the blocks."""
    fa = flash_attn(layout)
    caches = layers(fa.shape(4 * 2, PAGE, 4, HEAD), fa.stride_order())
    result = vl.g1_layout(caches, 4)
    assert result[1:3] == (1, 2 * 4 * PAGE * 2 * HEAD * 2)
    check(caches, 0, (), 4, result, 2)


# ---- other backends' layouts, written from vLLM's backends ----

@pytest.mark.parametrize("heads", [1, 4])
@pytest.mark.parametrize("name,shape,order,block_dim,outer_dims", [
    # FlashInfer: (num_blocks, 2, block_size, num_kv_heads, head_size), NHD and HND
    ("flashinfer NHD", lambda h: (BLOCKS, 2, PAGE, h, HEAD), (0, 1, 2, 3, 4), 0, ()),
    ("flashinfer HND", lambda h: (BLOCKS, 2, PAGE, h, HEAD), (0, 1, 3, 2, 4), 0, ()),
    # older FlashAttention, ROCm: (2, num_blocks, block_size, num_kv_heads, head_size)
    ("K/V first", lambda h: (2, BLOCKS, PAGE, h, HEAD), None, 1, (0,)),
    # MLA: (num_blocks, block_size, head_size), K and V in one latent vector
    ("MLA", lambda h: (BLOCKS, PAGE, 36 * h), None, 0, ()),
])
def test_other_backends(name, shape, order, block_dim, outer_dims, heads):
    caches = layers(shape(heads), order)
    result = vl.g1_layout(caches, BLOCKS)
    t = next(iter(caches.values()))
    assert result[2] == 2 * t.numel() // BLOCKS // math.prod(t.shape[d] for d in outer_dims)
    check(caches, block_dim, outer_dims, BLOCKS, result)


@pytest.mark.parametrize("shape,order", [
    ((4, 4, PAGE, 2 * HEAD), (0, 1, 2, 3)),  # FlashAttention HND: heads == blocks
    ((4, 4, PAGE, 2 * HEAD), (0, 2, 1, 3)),  # NHD
    ((PAGE, PAGE, 32), None),                # MLA: block_size == blocks
    ((2, 4, 4, 2, HEAD), None),              # K/V first: block_size == blocks
])
def test_a_dim_inside_a_block_may_have_the_blocks_size(shape, order):
    caches = layers(shape, order)
    num_blocks = shape[1] if shape[0] == 2 else shape[0]
    result = vl.g1_layout(caches, num_blocks)
    check(caches, 1 if shape[0] == 2 else 0, (0,) if shape[0] == 2 else (), num_blocks, result)


def test_devices():
    t = Tensor.vllm((BLOCKS, PAGE, 32))
    for device, memory in [(types.SimpleNamespace(type="cuda", index=3), (kvtier.MEMORY_CUDA, 3)),
                           (types.SimpleNamespace(type="cuda", index=None),
                            (kvtier.MEMORY_CUDA, 0)),
                           (CPU, (kvtier.MEMORY_HOST, 0))]:
        t.device = device
        layout = vl.g1_layout({"l": t}, BLOCKS)[3]
        assert (layout.memory, layout.cuda_device) == memory
        layout = vl.cross_layer_layout(t, BLOCKS)[3]
        assert (layout.memory, layout.cuda_device) == memory


# ---- errors ----

def strided(shape, strides):
    return Tensor((ctypes.c_uint16 * 4096)(), shape, strides)


@pytest.mark.parametrize("caches,num_blocks,message", [
    ({"l0": object()}, BLOCKS, r"layer l0: a tensor is needed, not object"),
    ({}, BLOCKS, r"nothing to register: 0 layers"),
    ({"l0": strided((6, 16, 16), (256, 16, 1))}, BLOCKS,
     r"layer l0: KV shape \(6, 16, 16\), strides \(256, 16, 1\): no dimension of 5 blocks"),
    ({"l0": strided((5, 16, 16), (256, 0, 1))}, BLOCKS, r"layer l0: .*zero or negative stride"),
    ({"l0": strided((5, 16, 16), (512, 32, 1))}, BLOCKS,
     r"strides \(512, 32, 1\): a block is not contiguous: dimension 1 has stride 32, not 16"),
    ({"l0": strided((5, 16, 16), (256, 16, 16))}, BLOCKS, r"a block is not contiguous"),
    ({"l0": strided((5, 16, 16), (128, 16, 1))}, BLOCKS,
     r"the blocks overlap: a block is 256 elements, its stride 128"),
    ({"l0": strided((5, 16, 16), (256, 256, 1))}, BLOCKS, r"the blocks' stride, they overlap"),
    ({"l0": strided((2, 5, 16, 16), (512, 256, 16, 1))}, BLOCKS,
     r"the chunks of dimensions \[0\] overlap"),  # V of block b is K of block b + 2
    ({"l0": strided((2, 2, 16, 16), (512, 256, 16, 1))}, 2,
     r"ambiguous with 2 blocks: dimensions 0 and 1 both have size 2"),
    # kernel blocks: 5 blocks of 2, spaced as vLLM's padded pages would space them
    ({"l0": strided((10, 16, 16), (272, 16, 1))}, BLOCKS,
     r"strides \(272, 16, 1\): dimension 0 holds 2 kernel blocks a block \(5 blocks\), "
     r"which are not one run: a kernel block is 256 elements, its stride 272"),
    ({"l0": strided((10, 16, 16), (128, 16, 1))}, BLOCKS,
     r"the kernel blocks overlap: a kernel block is 256 elements, its stride 128"),
    ({"l0": strided((2, 10, 16, 16), (512, 256, 16, 1))}, BLOCKS,
     r"the chunks of dimensions \[0\] overlap"),  # V of kernel block b is K of b + 2
    ({"l0": strided((5, 16, 16), (256, 16, 1)), "l1": strided((5, 8, 16), (128, 16, 1)),
      "l2": strided((5, 16, 16), (256, 16, 1))}, BLOCKS,
     r"the layers' KV differ: l1: 1 chunks of 256 bytes a block; "
     r"l0, l2: 1 chunks of 512 bytes a block"),
])
def test_errors(caches, num_blocks, message):
    with pytest.raises(ValueError, match=message):
        vl.g1_layout(caches, num_blocks)


def test_device_errors():
    a, b = strided((5, 16, 16), (256, 16, 1)), strided((5, 16, 16), (256, 16, 1))
    a.device = types.SimpleNamespace(type="cuda", index=1)
    with pytest.raises(ValueError, match=r"several devices: cpu:0: l1; cuda:1: l0"):
        vl.g1_layout({"l0": a, "l1": b}, BLOCKS)
    a.device = types.SimpleNamespace(type="xpu", index=0)
    with pytest.raises(ValueError, match=r"a xpu device: kvtier copies host and CUDA"):
        vl.g1_layout({"l0": a}, BLOCKS)


def test_cross_layer_needs_the_blocks_outermost():
    # a backend without an include_num_layers_dimension order: (num_layers, num_blocks, ...)
    t = Tensor.vllm((3, BLOCKS, PAGE, 2 * HEAD))
    with pytest.raises(ValueError, match=r"layer <all layers>: KV shape \(3, 5, 16, 16\), "
                                         r"strides \(1280, 256, 16, 1\): the blocks are not "
                                         r"the outermost dimension in memory"):
        vl.cross_layer_layout(t, BLOCKS)


# ---- through kvtier ----

def test_connector_copies_flash_attention_blocks(flash_attn):
    """Seed 003's requests A and B over two layers of FlashAttention NHD caches with 4 heads:
    A's blocks go to G2 and come back into B's blocks element for element."""
    fa = flash_attn("NHD")
    caches = layers(fa.shape(seed.NUM_GPU_BLOCKS, seed.PAGE, 4, HEAD), fa.stride_order(),
                    fill=False)
    names, num_outer, chunk_bytes, layout = vl.g1_layout(caches, seed.NUM_GPU_BLOCKS)

    class Engine:
        def forward(self, writes):  # a block's elements := values of its hash, in vLLM's order
            for b, h in writes:
                for t in caches.values():
                    for i, index in enumerate(itertools.product(*map(range, t.shape[1:]))):
                        t.buf[t.at((b,) + index)] = (h + i) & 0xFFFF

    def block(b):
        return [[t.get((b,) + index) for index in itertools.product(*map(range, t.shape[1:]))]
                for t in caches.values()]

    S = kvtier.ScheduledRequest
    with kvtier.Manager(page_size=seed.PAGE, num_layers=len(names), num_outer=num_outer,
                        chunk_bytes=chunk_bytes, g1_blocks=1, g2_blocks=50, g3_blocks=0) as m, \
            seed.connector(m) as c:
        c.register_kv_caches(layout, seed.NUM_GPU_BLOCKS)
        c.get_num_new_matched_tokens("A", seed.TOKENS_A, 0)
        c.update_state_after_alloc("A", [1, 2, 3], 0)
        seed.step(c, Engine(), [(S("A", 0, 40), [1, 2, 3], seed.TOKENS_A)], stored=2, loaded=0)
        a = [block(1), block(2)]
        c.request_finished("A")
        assert c.get_num_new_matched_tokens("B", seed.TOKENS_B, 0) == (32, False)
        c.update_state_after_alloc("B", [4, 5, 6, 7], 32)
        loaded, _ = seed.step(c, Engine(), [(S("B", 32, 20), [4, 5, 6, 7], seed.TOKENS_B)],
                              stored=3, loaded=2, after_load=lambda: [block(4), block(5)])
        assert loaded == a
