// Shared by the CUDA tests: whether a device is here, and an engine's KV cache on it.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "kvtier.h"

namespace kvt_test {

inline bool have_device() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

// The engine's KV cache as vLLM lays it out: one device tensor per (layer, K/V) holding
// every block's chunk of that layer, with a gap between chunks so that no block is
// contiguous anywhere.
struct EngineCache {
  std::vector<void *> regions;
  std::vector<const void *> bases;
  std::vector<uint64_t> strides;
  kvt_g1_layout layout{};
  EngineCache(const EngineCache &) = delete;
  EngineCache &operator=(const EngineCache &) = delete;
  EngineCache(uint32_t chunks, uint64_t blocks, uint64_t chunk_bytes) {
    const uint64_t stride = chunk_bytes + 512;
    for (uint32_t i = 0; i < chunks; ++i) {
      void *p = nullptr;
      EXPECT_EQ(cudaMalloc(&p, blocks * stride), cudaSuccess);
      EXPECT_EQ(cudaMemset(p, 0xEE, blocks * stride), cudaSuccess);
      regions.push_back(p);
      bases.push_back(p);
      strides.push_back(stride);
    }
    layout.struct_size = sizeof layout;
    layout.memory = KVT_MEMORY_CUDA;
    layout.cuda_device = 0;
    layout.bases = bases.data();
    layout.strides = strides.data();
  }
  ~EngineCache() {
    for (void *p : regions) cudaFree(p);
  }
};

}  // namespace kvt_test
