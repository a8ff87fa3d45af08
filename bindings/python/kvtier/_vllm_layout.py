"""The physical layout of vLLM's KV-cache tensors, read from their strides, as a
kvtier.G1Layout.

vLLM allocates a layer's KV cache flat, views it with the logical shape permuted by the
attention backend's stride order and permutes that view back (vllm/v1/worker/gpu/
attn_utils.py): FlashAttention's logical (num_blocks, num_kv_heads, block_size,
2 * head_size) has, in the default NHD layout, the tokens outside the heads in memory. So the
logical order says nothing about what is contiguous, and a copy of a block needs only that.
This module reads the layout from the strides alone, whatever order the backend chose
(FlashAttention, FlashInfer, the older (2, num_blocks, ...) FlashAttention, MLA, the
cross-layer tensor).

In one tensor:
- the block dim is the dim of size num_blocks (_block_dim: when several have that size), or
  of size num_blocks * k, k > 1: when the attention kernel's block size is block_size / k,
  vLLM views the cache as num_blocks * k kernel blocks (gpu_model_runner's kernel_num_blocks),
  kvtier block b being kernel blocks b*k .. b*k+k-1. These must be one run of bytes (a
  kernel block's stride is its size), and a block's chunk and stride are k kernel blocks';
- the dims with a larger stride are outer dims (the K/V pair of (2, num_blocks, ...)): each
  combination of their indices is one outer chunk, in the row-major order of their logical
  indices (K before V);
- the dims with a smaller stride lie inside a block: sorted by stride they must be dense,
  so that a block's chunk is one run of bytes whatever their logical order.
Size-1 dims carry no layout and are ignored.

Only data_ptr(), stride(d) (in elements), shape, element_size() and device are read: no
torch or vLLM import.
"""
import itertools

import kvtier

ALL_LAYERS = "<all layers>"  # the one layer name of cross_layer_layout


def _block_dim(shape, strides, dims, num_blocks, where):
    """(block dim, k): the outermost (largest-stride) dim of size num_blocks (k = 1) or of
    num_blocks * k kernel blocks, k > 1. Outside the blocks vLLM only puts the K/V pair of
    (2, num_blocks, ...); every other dim that can share num_blocks' size (heads, tokens,
    head size, layers) lies inside a block, or inside a kernel block. So only with num_blocks
    2, when the next dim in memory has size 2 too, can that dim be the K/V pair or the blocks:
    strides cannot tell, and that is an error. (With num_blocks 2, a K/V pair outside 2 * k
    kernel blocks reads as 2 blocks with a dim of size 2 * k inside, as before kernel blocks.)
    With num_blocks 1 every dim is a multiple: kernel blocks only where no dim has size 1."""
    exact = [d for d in range(len(shape)) if shape[d] == num_blocks]
    kernel = [] if num_blocks == 1 and exact else [
        d for d in dims if shape[d] > num_blocks and shape[d] % num_blocks == 0]
    candidates = sorted(exact + kernel, key=lambda d: (-strides[d], d not in exact))
    if not candidates:
        raise ValueError("%s: no dimension of %d blocks, nor of a multiple of %d (kernel "
                         "blocks)" % (where, num_blocks, num_blocks))
    block = candidates[0]
    below = [d for d in dims if strides[d] < strides[block]]
    after = max(below, key=lambda d: strides[d]) if below else None
    if num_blocks == 2 and shape[block] == 2 and after is not None and shape[after] == 2:
        raise ValueError("%s: ambiguous with 2 blocks: dimensions %d and %d both have size 2, "
                         "either can be the blocks or the K/V pair" % (where, block, after))
    return block, shape[block] // num_blocks


def _overlap(d, stride, n, size):
    """Whether runs of size elements at i * stride and at d + j * stride (i, j < n) meet."""
    k = max(-(n - 1), min(n - 1, -d // stride))  # d + k * stride nearest 0 is at k or k + 1
    return any(abs(d + j * stride) < size for j in (k, k + 1) if abs(j) < n)


def _tensor_layout(name, t, num_blocks, blocks_outermost):
    """(outer chunks' byte offsets, block stride, chunk bytes, bytes from data_ptr() to the
    tensor's end) of one tensor; blocks_outermost: no dim may lie outside the blocks."""
    if not all(hasattr(t, a) for a in ("data_ptr", "stride", "shape", "element_size")):
        raise ValueError("kvtier.vllm: layer %s: a tensor is needed, not %s"
                         % (name, type(t).__name__))
    shape = tuple(t.shape)
    strides = tuple(t.stride(d) for d in range(len(shape)))
    el = t.element_size()
    where = "kvtier.vllm: layer %s: KV shape %s, strides %s" % (name, shape, strides)
    dims = [d for d in range(len(shape)) if shape[d] > 1]
    if any(strides[d] <= 0 for d in dims):
        raise ValueError("%s: a zero or negative stride" % where)
    block, k = _block_dim(shape, strides, dims, num_blocks, where)
    bs = strides[block]  # a kernel block's when k > 1
    if any(strides[d] == bs for d in dims if d != block):
        raise ValueError("%s: a dimension has the blocks' stride, they overlap" % where)
    outer = [d for d in dims if strides[d] > bs]  # in logical order
    if blocks_outermost and outer:
        raise ValueError("%s: the blocks are not the outermost dimension in memory" % where)
    chunk = 1
    for d in sorted((d for d in dims if strides[d] < bs), key=lambda d: strides[d]):
        if strides[d] != chunk:
            raise ValueError("%s: a block is not contiguous: dimension %d has stride %d, not %d"
                             % (where, d, strides[d], chunk))
        chunk *= shape[d]
    if bs < chunk:
        kind = "kernel " if k > 1 else ""
        raise ValueError("%s: the %sblocks overlap: a %sblock is %d elements, its stride %d"
                         % (where, kind, kind, chunk, bs))
    if k > 1:
        if bs != chunk:
            raise ValueError(
                "%s: dimension %d holds %d kernel blocks a block (%d blocks), which are not "
                "one run: a kernel block is %d elements, its stride %d"
                % (where, block, k, num_blocks, chunk, bs))
        bs, chunk = k * bs, k * chunk  # block b: kernel blocks b*k .. b*k+k-1
    offsets = [sum(i * strides[d] for i, d in zip(index, outer))
               for index in itertools.product(*(range(shape[d]) for d in outer))]
    for a, b in itertools.combinations(offsets, 2):
        if _overlap(b - a, bs, num_blocks, chunk):
            raise ValueError("%s: the chunks of dimensions %s overlap" % (where, outer))
    end = sum((shape[d] - 1) * strides[d] for d in dims) + 1
    return [o * el for o in offsets], bs * el, chunk * el, end * el


def _memory(tensors):
    """(memory kind, CUDA device) of the tensors, all on one device. kvtier knows host and
    CUDA memory only: another device's pointer read as host memory would crash."""
    devices = {}
    for name, t in tensors.items():
        d = getattr(t, "device", None)
        devices.setdefault((getattr(d, "type", "cpu"), getattr(d, "index", None) or 0),
                           []).append(name)
    if len(devices) != 1:
        raise ValueError("kvtier.vllm: the KV caches are on several devices: %s"
                         % "; ".join("%s:%d: %s" % (k + (", ".join(v),))
                                     for k, v in sorted(devices.items())))
    (kind, index), = devices
    if kind == "cuda":
        return kvtier.MEMORY_CUDA, index
    if kind == "cpu":
        return kvtier.MEMORY_HOST, 0
    raise ValueError("kvtier.vllm: KV caches on a %s device: kvtier copies host and CUDA "
                     "memory only" % kind)


def g1_layout(kv_caches, num_blocks):
    """(layer names in order, num_outer, chunk_bytes, kvtier.G1Layout) of vLLM's per-layer
    KV tensors (register_kv_caches), num_blocks blocks each. Every layer must give the same
    num_outer and chunk_bytes. Each base is an (address, length) pair reaching the end of
    its tensor."""
    if num_blocks < 1 or not kv_caches:
        raise ValueError("kvtier.vllm: nothing to register: %d layers of %d blocks"
                         % (len(kv_caches), num_blocks))
    names, bases, strides, shapes = list(kv_caches), [], [], {}
    for name in names:
        t = kv_caches[name]
        offsets, bs, chunk, end = _tensor_layout(name, t, num_blocks, False)
        bases += [(t.data_ptr() + o, end - o) for o in offsets]
        strides += [bs] * len(offsets)
        shapes.setdefault((len(offsets), chunk), []).append(name)
    if len(shapes) != 1:
        raise ValueError("kvtier.vllm: the layers' KV differ: %s" % "; ".join(
            "%s: %d chunks of %d bytes a block" % (", ".join(v), o, c)
            for (o, c), v in sorted(shapes.items())))
    (num_outer, chunk_bytes), = shapes
    memory, device = _memory(kv_caches)
    return names, num_outer, chunk_bytes, kvtier.G1Layout(bases, strides, memory, device)


def cross_layer_layout(kv_cache, num_blocks):
    """g1_layout's tuple for register_cross_layers_kv_cache's one tensor, which holds every
    layer's KV. vLLM hands it over only when the blocks are outermost in memory (flash_attn's
    include_num_layers_dimension orders put the layers inside a block): a block of all the
    layers, heads, K and V is one chunk, so the layout has one layer, named ALL_LAYERS, and
    one outer chunk."""
    if num_blocks < 1:
        raise ValueError("kvtier.vllm: nothing to register: %d blocks" % num_blocks)
    _, bs, chunk, end = _tensor_layout(ALL_LAYERS, kv_cache, num_blocks, True)
    memory, device = _memory({ALL_LAYERS: kv_cache})
    layout = kvtier.G1Layout([(kv_cache.data_ptr(), end)], [bs], memory, device)
    return [ALL_LAYERS], 1, chunk, layout
