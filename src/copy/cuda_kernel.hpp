// The gather/scatter kernel behind KVT_CUDA_COPY_KERNEL: one thread block per segment, each
// copying its segment with 16-byte loads, four in flight per thread so that reads across
// PCIe overlap. The segment table lives in mapped pinned host memory and is read once per
// thread block. For chunks under about 1 MiB it moves scattered data at 0.9x or more of one
// contiguous copy, where cudaMemcpyBatchAsync reaches 0.06x-0.6x (docs/BENCHMARKS.md).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace kvt {

// Addresses as the device sees them: device memory, or the mapped address of pinned host
// memory.
struct KernelSegment {
  void *dst;
  const void *src;
  uint64_t len;
};

// Copies table[0..n) on `stream`; table is the device-visible address of the mapped table.
cudaError_t launch_copy_segments(const KernelSegment *table, uint32_t n, uint64_t chunk_hint,
                                 cudaStream_t stream);

}  // namespace kvt
