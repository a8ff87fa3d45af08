// Helpers of the transfer tests (test_xfer_*.cpp): a G3 directory, a small pipeline config,
// filled and registered G1 blocks, prefix matches and waits.
#pragma once

#include <stdlib.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "support.hpp"

namespace kvt_xfer_test {

using namespace kvt_test;
using namespace std::chrono_literals;


// 4 KiB blocks (2 layers x 2 x 1 KiB), batches due at once.
inline kvt_manager_config xfer_config(const TempDir &dir, uint64_t g1, uint64_t g2,
                                      uint64_t g3) {
  kvt_manager_config c = small_config(g1, g2, g3);
  c.chunk_bytes = 1024;
  c.g3_path = dir.path.c_str();
  c.flush_interval_us = 1000;
  c.min_batch_size = 1;
  return c;
}

// Fills new G1 blocks with a byte pattern and registers them as one chain.
inline std::vector<kvt_block> filled(kvt_manager *m, const std::vector<uint64_t> &hashes,
                                     unsigned char seed = 1) {
  auto b = alloc(m, hashes.size());
  for (size_t i = 0; i < b.size(); ++i) {
    void *p = nullptr;
    size_t len = 0;
    EXPECT_EQ(kvt_block_data(&p, &len, m, b[i]), KVT_OK) << kvt_last_error();
    if (p) std::memset(p, int(seed + i), len);
  }
  std::vector<kvt_block> out(b.size());
  EXPECT_EQ(kvt_block_register_hashes(out.data(), m, b.data(), hashes.data(), b.size(), 0),
            KVT_OK)
      << kvt_last_error();
  return out;
}

inline kvt_status finish(kvt_xfer *x) { return kvt_xfer_wait(x, int64_t{20} * 1000 * 1000 * 1000); }

inline uint32_t state_of_xfer(kvt_xfer *x) {
  uint32_t st = 0;
  kvt_xfer_status(&st, nullptr, nullptr, x);
  return st;
}

// Every tier of m holds nothing: all free or inactive.
inline void expect_all_returned(kvt_manager *m) {
  for (kvt_tier t : {KVT_TIER_G1, KVT_TIER_G2, KVT_TIER_G3}) {
    kvt_tier_stats s = stats(m, t);
    EXPECT_EQ(s.active, 0u) << "G" << int(t) << " still has referenced blocks";
    EXPECT_EQ(s.free + s.inactive + s.retired, s.capacity) << "G" << int(t);
  }
  EXPECT_KVT(kvt_manager_check(m), KVT_OK);
}

}  // namespace kvt_xfer_test
