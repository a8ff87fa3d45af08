#include "copy/cuda_engine.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <iterator>
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
// Runs in the kernel's first launch: few enough that the copies start at once, enough to
// keep the GPU busy while the next launch is filled. Each launch after it is twice as long.
constexpr size_t kFirstLaunch = 128;
constexpr size_t kLongestLaunch = size_t{1} << 30;  // under the grid's 2^31 - 1 blocks

// A table of at least `need` entries, from the pool or new; false when none can be had.
bool take_table(Table *out, std::vector<Table> &pool, std::mutex &mu, size_t need) {
  {
    std::lock_guard lock(mu);
    for (size_t i = 0; i < pool.size(); ++i)
      if (pool[i].cap >= need) {
        *out = pool[i];
        pool.erase(pool.begin() + std::ptrdiff_t(i));
        return true;
      }
  }
  Table t;
  t.cap = std::max<size_t>(need, 1024);
  void *p = nullptr, *d = nullptr;
  if (cudaHostAlloc(&p, t.cap * sizeof(KernelSegment), cudaHostAllocMapped) != cudaSuccess ||
      cudaHostGetDevicePointer(&d, p, 0) != cudaSuccess) {
    cudaGetLastError();
    cudaFreeHost(p);
    return false;
  }
  t.host = static_cast<KernelSegment *>(p);
  t.dev = static_cast<KernelSegment *>(d);
  *out = t;
  return true;
}

// The runs that go through cudaMemcpyBatchAsync, in its three arrays.
struct Batch {
  std::vector<void *> dst;
  std::vector<const void *> src;
  std::vector<size_t> len;

  void reserve(size_t n) {
    dst.reserve(n);
    src.reserve(n);
    len.reserve(n);
  }
  void add(const Segment &g) {
    dst.push_back(g.dst);
    src.push_back(g.src);
    len.push_back(g.len);
  }
  cudaError_t enqueue(cudaStream_t stream) {
    if (dst.empty()) return cudaSuccess;
    cudaMemcpyAttributes attr{};
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    size_t attr_index = 0;
    return cudaMemcpyBatchAsync(dst.data(), src.data(), len.data(), dst.size(), &attr,
                                &attr_index, 1, stream);
  }
};
}  // namespace

kvt_status CudaEngine::copy(SegmentCursor &segs, bool to_device) {
  const size_t total = segs.size();
  if (total == 0) return KVT_OK;
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

  // The kernel takes every run whose host side is mapped; the rest (staging buffers, and
  // everything when the kernel is not the method or no table can be had) are batched.
  Table table;
  const bool kernel = method_ == KVT_CUDA_COPY_KERNEL && !s.mapped.empty() &&
                      take_table(&table, s.tables, s.mu, total);
  const auto kind = to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
  Batch batch;
  if (!kernel && method_ != KVT_CUDA_COPY_PER_CHUNK) batch.reserve(total);
  size_t filled = 0, launched = 0, piece = kFirstLaunch;
  auto launch = [&] {
    r = launch_copy_segments(table.dev + launched, uint32_t(filled - launched),
                             table.host[launched].len, stream);
    launched = filled;
    piece = std::min(piece * 2, kLongestLaunch);
  };
  Segment run[64];
  for (size_t n; r == cudaSuccess && (n = segs.next(run, std::size(run))) > 0;) {
    for (size_t i = 0; i < n && r == cudaSuccess; ++i) {
      const Segment &g = run[i];
      if (method_ == KVT_CUDA_COPY_PER_CHUNK) {
        r = cudaMemcpyAsync(g.dst, g.src, g.len, kind, stream);
        continue;
      }
      const char *mapped = kernel ? device_address(s.mapped, to_device ? g.src : g.dst, g.len)
                                  : nullptr;
      if (mapped == nullptr) {
        batch.add(g);
        continue;
      }
      table.host[filled++] = to_device ? KernelSegment{g.dst, mapped, g.len}
                                       : KernelSegment{const_cast<char *>(mapped), g.src, g.len};
      if (filled - launched == piece) launch();
    }
  }
  if (r == cudaSuccess && filled > launched) launch();
  if (r == cudaSuccess) r = batch.enqueue(stream);
  if (r == cudaSuccess) r = cudaEventRecord(done, stream);
  if (r == cudaSuccess) r = cudaEventSynchronize(done);
  if (r != cudaSuccess) {
    cudaEventDestroy(done);  // its state after a failed copy is not worth reusing
    if (kernel) cudaFreeHost(table.host);  // never reused: a launch may not be over
    return cuda_fail(to_device ? "host-to-device copy" : "device-to-host copy", r);
  }
  std::lock_guard lock(s.mu);
  if (kernel) s.tables.push_back(table);
  s.events.push_back(done);
  return KVT_OK;
}

}  // namespace kvt
