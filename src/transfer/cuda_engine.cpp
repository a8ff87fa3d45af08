#include "transfer/cuda_engine.hpp"

#include <cuda_runtime_api.h>

#include <mutex>
#include <vector>

#include "common/error.hpp"
#include "memory/cuda.hpp"

namespace kvt {

// Copies in one direction share a stream, so the copy engine takes batches in the order they
// were enqueued and never idles between them. Each copy() waits on its own event, recorded
// after its copies on that stream: it returns once its own copies (and any enqueued before
// them) are done, without holding a lock, so that other threads enqueue meanwhile. Enqueuing
// onto a stream needs no lock: the CUDA runtime orders concurrent calls on a stream itself,
// and a thread's event follows its own copies whatever other threads put between them.
struct CudaEngine::Streams {
  int device = 0;
  cudaStream_t h2d = nullptr, d2h = nullptr;
  std::mutex mu;                     // guards only the free events
  std::vector<cudaEvent_t> events;  // created as copies in flight need them, reused
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
  if (r != cudaSuccess) return cuda_fail("creating the copy streams", r);
  *out = std::move(e);
  return KVT_OK;
}

CudaEngine::~CudaEngine() {
  if (!s_) return;
  cudaSetDevice(s_->device);
  for (cudaEvent_t e : s_->events) cudaEventDestroy(e);
  if (s_->h2d) cudaStreamDestroy(s_->h2d);
  if (s_->d2h) cudaStreamDestroy(s_->d2h);
}

kvt_status CudaEngine::copy(const std::vector<Segment> &segs, bool to_device) {
  if (segs.empty()) return KVT_OK;
  Streams &s = *s_;
  cudaStream_t stream = to_device ? s.h2d : s.d2h;
  cudaSetDevice(s.device);  // per thread: executors may not have set it yet
  cudaEvent_t done = nullptr;
  {
    std::lock_guard lock(s.mu);
    if (!s.events.empty()) {
      done = s.events.back();
      s.events.pop_back();
    }
  }
  cudaError_t r = cudaSuccess;
  if (done == nullptr) r = cudaEventCreateWithFlags(&done, cudaEventDisableTiming);
  if (r != cudaSuccess) return cuda_fail("creating a copy event", r);
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
  if (r != cudaSuccess) {
    cudaEventDestroy(done);  // its state after a failed copy is not worth reusing
    return cuda_fail(to_device ? "host-to-device copy" : "device-to-host copy", r);
  }
  std::lock_guard lock(s.mu);
  s.events.push_back(done);
  return KVT_OK;
}

}  // namespace kvt
