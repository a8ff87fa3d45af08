#include "common/error.hpp"
#include "copy/cuda_engine.hpp"

namespace kvt {

struct CudaEngine::Streams {};

kvt_status CudaEngine::create(std::unique_ptr<CudaEngine> *, int, kvt_cuda_copy, uint64_t) {
  return fail(KVT_ERR_UNSUPPORTED, "this kvtier was built without CUDA");
}

CudaEngine::~CudaEngine() = default;

kvt_status CudaEngine::copy(SegmentCursor &, bool) {
  return fail(KVT_ERR_UNSUPPORTED, "this kvtier was built without CUDA");
}

void CudaEngine::map_host(void *, size_t) {}

}  // namespace kvt
