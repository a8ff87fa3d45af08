#include "copy/cuda_kernel.hpp"

namespace kvt {

namespace {
__global__ void copy_segments(const KernelSegment *table) {
  __shared__ KernelSegment seg;
  if (threadIdx.x == 0) seg = table[blockIdx.x];
  __syncthreads();
  const auto *src = static_cast<const char *>(seg.src);
  auto *dst = static_cast<char *>(seg.dst);
  const uint64_t step = blockDim.x;
  if (((reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst) | seg.len) & 15) != 0) {
    for (uint64_t k = threadIdx.x; k < seg.len; k += step) dst[k] = src[k];  // unaligned: rare
    return;
  }
  const auto *s = reinterpret_cast<const int4 *>(src);
  auto *d = reinterpret_cast<int4 *>(dst);
  const uint64_t n = seg.len / 16;
  uint64_t k = threadIdx.x;
  for (; k + 3 * step < n; k += 4 * step) {
    const int4 a = s[k], b = s[k + step], c = s[k + 2 * step], e = s[k + 3 * step];
    d[k] = a;
    d[k + step] = b;
    d[k + 2 * step] = c;
    d[k + 3 * step] = e;
  }
  for (; k < n; k += step) d[k] = s[k];
}
}  // namespace

cudaError_t launch_copy_segments(const KernelSegment *table, uint32_t n, uint64_t chunk_hint,
                                 cudaStream_t stream) {
  const unsigned threads = chunk_hint >= (64u << 10) ? 1024 : 256;
  copy_segments<<<n, threads, 0, stream>>>(table);
  return cudaGetLastError();
}

}  // namespace kvt
