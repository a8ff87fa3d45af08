// Copies between CUDA device memory (G1) and host memory (G2, staging buffers): one stream
// per direction, each copy() awaiting its own CUDA event, so that concurrent calls queue their
// copies back to back instead of waiting for each other. Scattered chunks go through
// cudaMemcpyBatchAsync, or a gather/scatter kernel where the host side is pinned memory
// mapped for the device (KVT_CUDA_COPY_KERNEL, and AUTO for chunks under 1 MiB), launched
// in growing pieces as its table fills; one cudaMemcpyAsync per chunk is kept as the
// baseline to beat.
// cuda_engine.cpp implements it with CUDA; cuda_engine_absent.cpp says there is none.
#pragma once

#include <memory>

#include "kvtier.h"
#include "copy/segments.hpp"

namespace kvt {

class CudaEngine {
 public:
  // KVT_ERR_UNSUPPORTED without CUDA or without the device. chunk_bytes resolves AUTO.
  static kvt_status create(std::unique_ptr<CudaEngine> *out, int device, kvt_cuda_copy method,
                           uint64_t chunk_bytes);
  ~CudaEngine();
  CudaEngine(const CudaEngine &) = delete;
  CudaEngine &operator=(const CudaEngine &) = delete;

  // Copies every run of segs (host to device when to_device, else device to host) and
  // returns once they are done; KVT_ERR_CUDA with the message set on failure. Any thread,
  // any number at once; no lock is held while the copies run. The kernel starts on the
  // first runs while the cursor makes the rest.
  kvt_status copy(SegmentCursor &segs, bool to_device);

  // Host memory that was pinned and mapped (cuda::host_register) and that the kernel may
  // read or write directly; call before the first copy. Memory CUDA cannot map is ignored,
  // and copies touching it take the batched path.
  void map_host(void *base, size_t bytes);

 private:
  CudaEngine() = default;
  kvt_cuda_copy method_ = KVT_CUDA_COPY_BATCHED;
  struct Streams;
  std::unique_ptr<Streams> s_;
};

}  // namespace kvt
