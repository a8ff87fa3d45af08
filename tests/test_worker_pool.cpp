// The worker pool runs several callers' jobs at once (max_concurrent_transfers > 1 copies in
// parallel), and every index of every job runs exactly once. Also run under TSan.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "support.hpp"
#include "copy/worker_pool.hpp"

namespace {

// Each job's first index waits until the other job has started one of its own. A pool that
// runs one job at a time never lets the second start, so the wait times out.
TEST(Threads, WorkerPoolRunsTwoCallersJobsAtOnce) {
  kvt::WorkerPool pool(1);
  std::mutex mu;
  std::condition_variable cv;
  bool started[2] = {false, false};
  bool saw_other[2] = {false, false};
  auto caller = [&](int me) {
    pool.parallel_for(2, [&](size_t i) {
      if (i != 0) return;
      std::unique_lock lock(mu);
      started[me] = true;
      cv.notify_all();
      saw_other[me] = cv.wait_for(lock, std::chrono::seconds(10), [&] { return started[1 - me]; });
    });
  };
  std::thread a(caller, 0), b(caller, 1);
  a.join();
  b.join();
  EXPECT_TRUE(saw_other[0]);
  EXPECT_TRUE(saw_other[1]);
}

TEST(Threads, WorkerPoolManyCallersRunEveryIndexOnce) {
  kvt::WorkerPool pool(3);
  std::atomic<int> bad{0};
  auto caller = [&](int id) {
    std::mt19937 rng(id);
    for (int iter = 0; iter < 300; ++iter) {
      size_t n = 1 + rng() % 17;
      std::vector<std::atomic<int>> ran(n);
      pool.parallel_for(n, [&](size_t i) { ran[i].fetch_add(1); });
      for (auto &r : ran) bad += r.load() != 1;
    }
  };
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t) ts.emplace_back(caller, t);
  for (auto &t : ts) t.join();
  EXPECT_EQ(bad.load(), 0);
}

// Four offloads at once on four executors, each large enough to be split over the pool:
// every byte arrives in G2, in the right block.
TEST(Threads, ConcurrentSplitCopiesKeepEveryByte) {
  constexpr uint32_t kPer = 4, kXfers = 4, kN = kPer * kXfers;
  kvt_manager_config c = kvt_test::small_config(kN, kN);
  c.chunk_bytes = 128 << 10;  // 2 x 2 x 128 KiB = 512 KiB blocks, 2 MiB per transfer
  c.max_concurrent_transfers = kXfers;
  c.copy_threads = 3;
  c.max_batch_size = kPer;  // one transfer per batch
  c.min_batch_size = 1;
  auto m = kvt_test::make(c);
  std::vector<kvt_block> g1(kN);
  std::vector<uint64_t> h(kN);
  ASSERT_KVT_OK(kvt_block_alloc(g1.data(), kN, m.get(), KVT_TIER_G1));
  for (uint32_t i = 0; i < kN; ++i) {
    h[i] = 1000 + i;
    void *p;
    size_t len;
    ASSERT_KVT_OK(kvt_block_data(&p, &len, m.get(), g1[i]));
    for (size_t b = 0; b < len; b += 8) std::memcpy(static_cast<char *>(p) + b, &h[i], 8);
  }
  ASSERT_KVT_OK(kvt_block_register_hashes(g1.data(), m.get(), g1.data(), h.data(), kN, 0));
  std::vector<std::thread> ts;
  std::atomic<int> failed{0};
  for (uint32_t t = 0; t < kXfers; ++t)
    ts.emplace_back([&, t] {
      kvt_xfer *x = nullptr;
      if (kvt_xfer_offload(&x, m.get(), g1.data() + t * kPer, kPer, KVT_TIER_G2, nullptr, t) !=
              KVT_OK ||
          kvt_xfer_wait(x, -1) != KVT_OK)
        ++failed;
      kvt_xfer_release(x);
    });
  for (auto &t : ts) t.join();
  EXPECT_EQ(failed.load(), 0);
  std::vector<kvt_block> g2(kN);
  size_t hit = 0;
  ASSERT_KVT_OK(kvt_tier_match_prefix(&hit, g2.data(), m.get(), KVT_TIER_G2, h.data(), kN));
  ASSERT_EQ(hit, kN);
  for (uint32_t i = 0; i < kN; ++i) {
    void *p;
    size_t len;
    ASSERT_KVT_OK(kvt_block_data(&p, &len, m.get(), g2[i]));
    size_t wrong = 0;
    for (size_t b = 0; b < len; b += 8) wrong += std::memcmp(static_cast<char *>(p) + b, &h[i], 8) != 0;
    EXPECT_EQ(wrong, 0u) << "block " << i;
  }
  kvt_block_release(m.get(), g2.data(), kN);
  kvt_block_release(m.get(), g1.data(), kN);
  EXPECT_KVT(kvt_manager_check(m.get()), KVT_OK);
}

}  // namespace
