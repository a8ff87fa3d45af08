# kvtier.vllm's layout reader (bindings/python/kvtier/_vllm_layout.py) over real torch CUDA
# tensors laid out as vLLM lays them out (FlashAttention NHD and HND, FlashInfer NHD and HND,
# the older (2, num_blocks, ...) FlashAttention, MLA): each chunk's address and size checked
# against torch's own view of that block. For the GPU machine (bench/cuda.sh), whose Python
# has torch but not cffi: kvtier's module is stood in for by the three names the reader uses.
#   python3 bench/vllm_layout_torch.py
import os
import sys
import types

import torch
fake = types.ModuleType("kvtier")  # only what _vllm_layout reads of kvtier
fake.MEMORY_HOST, fake.MEMORY_CUDA = 1, 2
class G1Layout:
    def __init__(self, bases, strides, memory=1, cuda_device=0):
        self.bases, self.strides, self.memory, self.cuda_device = bases, strides, memory, cuda_device
fake.G1Layout = G1Layout
sys.modules["kvtier"] = fake
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "bindings", "python", "kvtier"))
import _vllm_layout as L
def cache(logical, order):
    physical = tuple(logical[i] for i in order)
    return torch.empty(physical, dtype=torch.bfloat16, device="cuda").permute(*[order.index(i) for i in range(len(order))])
N, H, P, D = 24, 8, 16, 128
cases = {"flash NHD": ((N, H, P, 2 * D), (0, 2, 1, 3)), "flash HND": ((N, H, P, 2 * D), (0, 1, 2, 3)),
         "flashinfer NHD": ((N, 2, P, H, D), (0, 1, 2, 3, 4)), "flashinfer HND": ((N, 2, P, H, D), (0, 1, 3, 2, 4)),
         "old flash": ((2, N, P, H, D), (0, 1, 2, 3, 4)), "mla": ((N, P, 576), (0, 1, 2))}
for name, (logical, order) in cases.items():
    caches = {"l%d" % i: cache(logical, order) for i in range(3)}
    names, outer, chunk, g1 = L.g1_layout(caches, N)
    assert g1.memory == 2
    for li, n in enumerate(names):
        t = caches[n]
        for b in range(N):
            parts = [t[o, b] for o in range(2)] if logical[0] == 2 else [t[b]]
            for o, v in enumerate(parts):
                base, _ = g1.bases[li * outer + o]
                addr = base + b * g1.strides[li * outer + o]
                lo = v.data_ptr()
                hi = lo + sum((s - 1) * st for s, st in zip(v.shape, v.stride())) * v.element_size() + v.element_size()
                if not ((addr, chunk) == (lo, hi - lo) and v.numel() * v.element_size() == chunk):
                    print("MISMATCH", name, n, b, o, g1.bases[li * outer + o], g1.strides[li * outer + o], addr, chunk, lo, hi - lo, v.numel() * v.element_size(), t.shape, t.stride(), t.data_ptr())
                    sys.exit(1)
    print("ok", name, "num_outer", outer, "chunk", chunk)
print("torch", torch.__version__, torch.cuda.get_device_name())
