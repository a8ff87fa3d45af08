#include "transfer/cuda_engine.hpp"

#include <cuda_runtime_api.h>

#include <mutex>

#include "common/error.hpp"
#include "memory/cuda.hpp"

namespace kvt {

struct CudaEngine::Streams {
  int device = 0;
  cudaStream_t h2d = nullptr, d2h = nullptr;
  cudaEvent_t done_h2d = nullptr, done_d2h = nullptr;
  std::mutex mu_h2d, mu_d2h;  // one batch per direction at a time
};

namespace {
kvt_status cuda_fail(const char *what, cudaError_t e) {
  cudaGetLastError();
  return fail(KVT_ERR_CUDA, "%s: %s", what, cudaGetErrorString(e));
}
}  // namespace

kvt_status CudaEngine::create(std::unique_ptr<CudaEngine> *out, int device,
                              kvt_cuda_copy method) {
  if (!cuda::device_present(device))
    return fail(KVT_ERR_UNSUPPORTED, "CUDA device %d is not available", device);
  std::unique_ptr<CudaEngine> e(new CudaEngine());
  e->method_ = method;
  e->s_ = std::make_unique<Streams>();
  Streams &s = *e->s_;
  s.device = device;
  cudaError_t r = cudaSetDevice(device);
  if (r == cudaSuccess) r = cudaStreamCreateWithFlags(&s.h2d, cudaStreamNonBlocking);
  if (r == cudaSuccess) r = cudaStreamCreateWithFlags(&s.d2h, cudaStreamNonBlocking);
  if (r == cudaSuccess) r = cudaEventCreateWithFlags(&s.done_h2d, cudaEventDisableTiming);
  if (r == cudaSuccess) r = cudaEventCreateWithFlags(&s.done_d2h, cudaEventDisableTiming);
  if (r != cudaSuccess) return cuda_fail("creating the copy streams", r);
  *out = std::move(e);
  return KVT_OK;
}

CudaEngine::~CudaEngine() {
  if (!s_) return;
  cudaSetDevice(s_->device);
  if (s_->done_h2d) cudaEventDestroy(s_->done_h2d);
  if (s_->done_d2h) cudaEventDestroy(s_->done_d2h);
  if (s_->h2d) cudaStreamDestroy(s_->h2d);
  if (s_->d2h) cudaStreamDestroy(s_->d2h);
}

kvt_status CudaEngine::copy(const std::vector<Segment> &segs, bool to_device) {
  if (segs.empty()) return KVT_OK;
  Streams &s = *s_;
  std::lock_guard lock(to_device ? s.mu_h2d : s.mu_d2h);
  cudaStream_t stream = to_device ? s.h2d : s.d2h;
  cudaEvent_t done = to_device ? s.done_h2d : s.done_d2h;
  cudaSetDevice(s.device);
  cudaError_t r = cudaSuccess;
  if (method_ == KVT_CUDA_COPY_BATCHED) {
    std::vector<void *> dsts(segs.size());
    std::vector<const void *> srcs(segs.size());
    std::vector<size_t> sizes(segs.size());
    for (size_t i = 0; i < segs.size(); ++i) {
      dsts[i] = segs[i].dst;
      srcs[i] = segs[i].src;
      sizes[i] = segs[i].len;
    }
    cudaMemcpyAttributes attr{};
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    size_t attr_index = 0;
    r = cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), segs.size(), &attr,
                             &attr_index, 1, stream);
  } else {
    auto kind = to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
    for (const Segment &g : segs) {
      r = cudaMemcpyAsync(g.dst, g.src, g.len, kind, stream);
      if (r != cudaSuccess) break;
    }
  }
  if (r == cudaSuccess) r = cudaEventRecord(done, stream);
  if (r == cudaSuccess) r = cudaEventSynchronize(done);
  if (r != cudaSuccess)
    return cuda_fail(to_device ? "host-to-device copy" : "device-to-host copy", r);
  return KVT_OK;
}

}  // namespace kvt
