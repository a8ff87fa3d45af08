#include "copy/cuda_engine.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <vector>

#include "common/error.hpp"
#include "memory/cuda.hpp"
#include "copy/cuda_kernel.hpp"

namespace kvt {

namespace {
constexpr uint64_t kKernelBelow = 1 << 20;  // AUTO: the kernel for chunks under 1 MiB

// A segment table for the kernel, in mapped pinned host memory: filled by the host, read by
// the kernel through `dev`.
struct Table {
  KernelSegment *host = nullptr, *dev = nullptr;
  size_t cap = 0;
};

// Pinned host memory the device may address directly.
struct MappedRange {
  const char *host, *dev;
  size_t bytes;
};
}  // namespace

// Copies in one direction share a stream, so the copy engine takes batches in the order they
// were enqueued and never idles between them. Each copy() waits on its own event, recorded
// after its copies on that stream: it returns once its own copies (and any enqueued before
// them) are done, without holding a lock, so that other threads enqueue meanwhile. Enqueuing
// onto a stream needs no lock: the CUDA runtime orders concurrent calls on a stream itself,
// and a thread's event follows its own copies whatever other threads put between them.
struct CudaEngine::Streams {
  int device = 0;
  cudaStream_t h2d = nullptr, d2h = nullptr;
  std::mutex mu;                     // guards the free events and tables
  std::vector<cudaEvent_t> events;  // created as copies in flight need them, reused
  std::vector<Table> tables;        // likewise, for the kernel
  std::vector<MappedRange> mapped;  // set up before the first copy, read-only after
};

namespace {
kvt_status cuda_fail(const char *what, cudaError_t e) {
  cudaGetLastError();
  return fail(KVT_ERR_CUDA, "%s: %s", what, cudaGetErrorString(e));
}

// The device's address of host address p, or null when p is in no mapped range.
const char *device_address(const std::vector<MappedRange> &mapped, const char *p, size_t len) {
  for (const MappedRange &r : mapped)
    if (p >= r.host && len <= r.bytes && p - r.host <= std::ptrdiff_t(r.bytes - len))
      return r.dev + (p - r.host);
  return nullptr;
}
}  // namespace

kvt_status CudaEngine::create(std::unique_ptr<CudaEngine> *out, int device,
                              kvt_cuda_copy method, uint64_t chunk_bytes) {
  if (!cuda::device_present(device))
    return fail(KVT_ERR_UNSUPPORTED, "CUDA device %d is not available", device);
  std::unique_ptr<CudaEngine> e(new CudaEngine());
  if (method == KVT_CUDA_COPY_AUTO)
    method = chunk_bytes < kKernelBelow ? KVT_CUDA_COPY_KERNEL : KVT_CUDA_COPY_BATCHED;
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
  for (Table &t : s_->tables) cudaFreeHost(t.host);
  if (s_->h2d) cudaStreamDestroy(s_->h2d);
  if (s_->d2h) cudaStreamDestroy(s_->d2h);
}

void CudaEngine::map_host(void *base, size_t bytes) {
  void *dev = nullptr;
  if (base == nullptr || bytes == 0) return;
  if (cudaHostGetDevicePointer(&dev, base, 0) != cudaSuccess) {
    cudaGetLastError();  // not mapped: its copies go through cudaMemcpyBatchAsync
    return;
  }
  s_->mapped.push_back({static_cast<const char *>(base), static_cast<const char *>(dev), bytes});
}

namespace {
// A table for the segments, their host sides translated to device addresses; false (and
// the table left in `pool`) when a segment's host side is not mapped memory, or no table can
// be had.
bool kernel_table(Table *out, std::vector<Table> &pool, std::mutex &mu,
                  const std::vector<MappedRange> &mapped, const std::vector<Segment> &segs,
                  bool to_device) {
  Table t;
  {
    std::lock_guard lock(mu);
    for (size_t i = 0; i < pool.size(); ++i)
      if (pool[i].cap >= segs.size()) {
        t = pool[i];
        pool.erase(pool.begin() + std::ptrdiff_t(i));
        break;
      }
  }
  if (t.host == nullptr) {
    t.cap = std::max<size_t>(segs.size(), 1024);
    void *p = nullptr, *d = nullptr;
    if (cudaHostAlloc(&p, t.cap * sizeof(KernelSegment), cudaHostAllocMapped) != cudaSuccess ||
        cudaHostGetDevicePointer(&d, p, 0) != cudaSuccess) {
      cudaGetLastError();
      cudaFreeHost(p);
      return false;
    }
    t.host = static_cast<KernelSegment *>(p);
    t.dev = static_cast<KernelSegment *>(d);
  }
  for (size_t i = 0; i < segs.size(); ++i) {
    const Segment &g = segs[i];
    const char *mapped_side = device_address(mapped, to_device ? g.src : g.dst, g.len);
    if (mapped_side == nullptr) {
      std::lock_guard lock(mu);
      pool.push_back(t);
      return false;
    }
    t.host[i] = to_device ? KernelSegment{g.dst, mapped_side, g.len}
                          : KernelSegment{const_cast<char *>(mapped_side), g.src, g.len};
  }
  *out = t;
  return true;
}
}  // namespace

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
  Table table;
  const bool kernel = method_ == KVT_CUDA_COPY_KERNEL && segs.size() <= INT32_MAX &&
                      kernel_table(&table, s.tables, s.mu, s.mapped, segs, to_device);
  if (kernel) {
    r = launch_copy_segments(table.dev, uint32_t(segs.size()), segs[0].len, stream);
  } else if (method_ == KVT_CUDA_COPY_PER_CHUNK) {
    auto kind = to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
    for (const Segment &g : segs) {
      r = cudaMemcpyAsync(g.dst, g.src, g.len, kind, stream);
      if (r != cudaSuccess) break;
    }
  } else {  // BATCHED, and KERNEL for host memory that is not mapped
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
  }
  if (r == cudaSuccess) r = cudaEventRecord(done, stream);
  if (r == cudaSuccess) r = cudaEventSynchronize(done);
  if (r != cudaSuccess) {
    cudaEventDestroy(done);  // its state after a failed copy is not worth reusing
    if (kernel) cudaFreeHost(table.host);  // never reused: the kernel may not be over
    return cuda_fail(to_device ? "host-to-device copy" : "device-to-host copy", r);
  }
  std::lock_guard lock(s.mu);
  if (kernel) s.tables.push_back(table);
  s.events.push_back(done);
  return KVT_OK;
}

}  // namespace kvt
