// Four threads enqueue thousands of offloads and onboards with random fences and cancels.
// Every handle ends in exactly one terminal event, and every pool returns to its starting
// counts. Runs under ThreadSanitizer too (tools/test.sh).
#include <atomic>
#include <filesystem>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "support.hpp"

using namespace kvt_test;

TEST(Threads, PipelineStressEveryTransferEndsOnce) {
  char tmpl[] = "/tmp/kvtier-stress-XXXXXX";
  std::string dir = mkdtemp(tmpl);
  kvt_manager_config c = small_config(256, 256, 512);
  c.chunk_bytes = 512;
  c.g3_path = dir.c_str();
  c.event_capacity = 1 << 16;
  c.flush_interval_us = 200;
  c.max_concurrent_transfers = 2;
  auto m = make(c);
  // A registered prefix in G1 that every thread offloads (they race for it).
  auto base = store(m.get(), {1, 2, 3, 4, 5, 6, 7, 8});

  std::mutex mu;
  std::set<kvt_xfer *> live;  // enqueued and not yet seen ending
  std::atomic<uint64_t> enqueued{0}, failures{0};
  auto worker = [&](int id) {
    std::mt19937_64 rng(id);
    std::vector<kvt_xfer *> mine;
    for (int i = 0; i < 1500; ++i) {
      kvt_fence *f = nullptr;
      if (rng() % 3 == 0 && kvt_fence_create(&f, m.get()) != KVT_OK) ++failures;
      // Offload a random slice of the shared prefix, G1 -> G2 or G1 -> G3.
      size_t from = rng() % 8, len = 1 + rng() % (8 - from);
      kvt_tier dst = rng() % 2 ? KVT_TIER_G2 : KVT_TIER_G3;
      kvt_xfer *x = nullptr;
      if (kvt_xfer_offload(&x, m.get(), base.data() + from, len, dst, f, uint64_t(id) << 32 | i) !=
          KVT_OK) {
        ++failures;
      } else {
        {
          std::lock_guard lock(mu);
          live.insert(x);
        }
        mine.push_back(x);
        ++enqueued;
      }
      switch (rng() % 4) {
        case 0: kvt_xfer_cancel(x); break;
        case 1: if (f) kvt_fence_signal(f); break;
        default: break;
      }
      if (f != nullptr) {
        if (rng() % 2) kvt_fence_signal(f);
        kvt_fence_destroy(f);  // unsignalled ones cancel their waiters
      }
    }
    for (kvt_xfer *x : mine)
      if (kvt_xfer_wait(x, int64_t(30) * 1000 * 1000 * 1000) == KVT_TIMEOUT) ++failures;
  };
  std::vector<std::thread> ts;
  for (int i = 0; i < 4; ++i) ts.emplace_back(worker, i + 1);
  // Meanwhile the main thread drains events and checks each transfer ends exactly once.
  uint64_t ended = 0, ok = 0, cancelled = 0, other = 0, duplicates = 0;
  std::vector<kvt_xfer *> seen;
  auto pump = [&] {
    kvt_event ev[512];
    size_t n = kvt_manager_poll(m.get(), ev, 512);
    for (size_t i = 0; i < n; ++i) {
      if (ev[i].type != KVT_EVENT_XFER_DONE) continue;
      std::lock_guard lock(mu);
      if (live.erase(ev[i].xfer) == 0) ++duplicates;
      ++ended;
      seen.push_back(ev[i].xfer);
      if (ev[i].status == KVT_OK) ++ok;
      else if (ev[i].status == KVT_ERR_CANCELLED) ++cancelled;
      else ++other;
    }
    return n;
  };
  for (auto &t : ts) t.join();
  while (pump() > 0) {
  }
  EXPECT_EQ(failures.load(), 0u);
  EXPECT_EQ(duplicates, 0u);
  EXPECT_EQ(ended, enqueued.load());
  EXPECT_TRUE(live.empty()) << live.size() << " transfers never ended";
  EXPECT_GT(ok, 0u);
  EXPECT_GT(cancelled, 0u);
  EXPECT_EQ(other, 0u);
  for (kvt_xfer *x : seen) kvt_xfer_release(x);
  // Pools back to their starting counts: G1 holds only the prefix, G2 and G3 only
  // unreferenced copies of it.
  ASSERT_KVT_OK(kvt_block_release(m.get(), base.data(), base.size()));
  EXPECT_KVT(kvt_manager_check(m.get()), KVT_OK);
  for (kvt_tier t : {KVT_TIER_G1, KVT_TIER_G2, KVT_TIER_G3}) {
    kvt_tier_stats s = stats(m.get(), t);
    EXPECT_EQ(s.active, 0u) << "G" << t;
    EXPECT_LE(s.registered, 8u) << "G" << t;
    EXPECT_EQ(s.free + s.inactive, s.capacity) << "G" << t;
  }
  m.reset();
  EXPECT_FALSE(std::filesystem::exists(dir) && !std::filesystem::is_empty(dir))
      << "the G3 file outlived its manager";
  std::filesystem::remove_all(dir);
}
