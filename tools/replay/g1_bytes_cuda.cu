#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "g1_bytes.hpp"
#include "pattern.hpp"

namespace kvt::replay {

namespace {
// One staging buffer per thread, for the checks: --concurrency runs requests on several
// threads.
std::vector<char> &staging(size_t len) {
  thread_local std::vector<char> buf;
  if (buf.size() < len) buf.resize(len);
  return buf;
}

bool cuda_ok(cudaError_t e, const char *what, std::string *error) {
  if (e == cudaSuccess) return true;
  cudaGetLastError();
  if (error) *error = std::string(what) + ": " + cudaGetErrorString(e);
  return false;
}
}  // namespace

bool g1_cuda_ready(std::string *why) {
  int n = 0;
  if (!cuda_ok(cudaGetDeviceCount(&n), "no CUDA device", why)) return false;
  if (n == 0) *why = "no CUDA device on this machine";
  return n > 0;
}

void *g1_alloc(bool cuda, size_t bytes, std::string *error) {
  if (!cuda) {
    void *p = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
    if (p == nullptr) *error = std::to_string(bytes) + " bytes of host memory: out of memory";
    return p;
  }
  void *p = nullptr;
  if (!cuda_ok(cudaMalloc(&p, bytes), "cudaMalloc", error) ||
      !cuda_ok(cudaMemset(p, 0, bytes), "cudaMemset", error)) {
    cudaFree(p);
    *error = std::to_string(bytes) + " bytes of CUDA device memory: " + *error;
    return nullptr;
  }
  return p;
}

void g1_free(bool cuda, void *p) {
  if (cuda) cudaFree(p);
  else std::free(p);
}

namespace {
// Words [first, end) of the pattern of `hash`, written on the device as an engine's forward
// writes its KV: no host staging and no PCIe traffic beside the copies under test.
__global__ void fill_words(uint64_t *block, size_t first, size_t end, uint64_t hash) {
  for (size_t i = first + blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < end;
       i += size_t(gridDim.x) * blockDim.x)
    block[i] = word_of(hash, i);
}

// Synchronous, as the cudaMemcpy it replaced: the connector's streams do not wait for the
// default stream, so the bytes must be there before the engine says they are.
bool fill_on_device(void *block, size_t from, size_t len, uint64_t hash, std::string *error) {
  const size_t first = from / 8, end = (from + len) / 8;
  if (end <= first) return true;
  const unsigned threads = 256;
  const unsigned grid = unsigned(std::min<size_t>((end - first + threads - 1) / threads, 1024));
  fill_words<<<grid, threads>>>(static_cast<uint64_t *>(block), first, end, hash);
  return cuda_ok(cudaGetLastError(), "launching G1's fill", error) &&
         cuda_ok(cudaStreamSynchronize(nullptr), "filling G1", error);
}
}  // namespace

bool g1_fill(bool cuda, void *p, size_t len, uint64_t hash, std::string *error) {
  if (!cuda) {
    fill(p, len, hash);
    return true;
  }
  return fill_on_device(p, 0, len, hash, error);
}

bool g1_fill_range(bool cuda, void *p, size_t from, size_t len, uint64_t hash,
                   std::string *error) {
  if (!cuda) {
    fill_range(p, from, len, hash);
    return true;
  }
  return fill_on_device(p, from, len, hash, error);
}

bool g1_holds(bool cuda, const void *p, size_t len, uint64_t hash, std::string *error) {
  if (!cuda) return holds(p, len, hash);
  std::vector<char> &b = staging(len);
  if (!cuda_ok(cudaMemcpy(b.data(), p, len, cudaMemcpyDeviceToHost), "cudaMemcpy from G1", error))
    return false;
  return holds(b.data(), len, hash);
}

kvt_status g1_block_ptr(void **out, size_t *len, kvt_manager *m, kvt_block b, bool cuda) {
  if (!cuda) return kvt_block_data(out, len, m, b);
  kvt_tier_stats st{};
  st.struct_size = sizeof st;
  if (kvt_status s = kvt_tier_stats_get(&st, m, KVT_TIER_G1); s != KVT_OK) return s;
  *len = st.block_bytes;
  return kvt_block_chunk(out, m, b, 0, 0);
}

}  // namespace kvt::replay
