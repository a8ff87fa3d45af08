// Four threads hammer alloc, register, match and release on one manager; afterwards every
// tier's counts add up and kvt_manager_check finds nothing wrong. Also run under TSan.
#include <atomic>
#include <random>
#include <thread>

#include "support.hpp"

using namespace kvt_test;

TEST(Threads, FourThreadsKeepTheManagerConsistent) {
  kvt_manager_config c = small_config(512, 256);
  c.event_capacity = 1024;
  auto m = make(c);
  std::atomic<uint64_t> failures{0}, ops{0};
  auto worker = [&](int id) {
    std::mt19937_64 rng(id);
    std::vector<kvt_block> held;
    for (int iter = 0; iter < 20000; ++iter) {
      kvt_tier tier = (rng() % 4 == 0) ? KVT_TIER_G2 : KVT_TIER_G1;
      // A "request": a chain of up to 8 hashes drawn from a small space, so threads
      // share prefixes, dedup against each other and evict each other's blocks.
      size_t len = 1 + rng() % 8;
      uint64_t root = rng() % 64;
      std::vector<uint64_t> chain(len);
      for (size_t i = 0; i < len; ++i) chain[i] = root * 100 + i + 1;
      std::vector<kvt_block> got(len);
      size_t hit = 0;
      if (kvt_match_prefix(&hit, got.data(), m.get(), tier, chain.data(), len) != KVT_OK)
        ++failures;
      got.resize(hit);
      size_t need = len - hit;
      std::vector<kvt_block> fresh(need);
      if (need > 0) {
        kvt_status s = kvt_block_alloc(fresh.data(), need, m.get(), tier);
        if (s == KVT_ERR_NO_SPACE) {
          kvt_block_release(m.get(), got.data(), got.size());
          continue;
        }
        if (s != KVT_OK) ++failures;
      }
      for (size_t i = 0; i < need; ++i) {
        kvt_block r = 0;
        uint64_t parent = hit + i == 0 ? 0 : chain[hit + i - 1];
        if (kvt_block_register_hash(&r, m.get(), fresh[i], chain[hit + i], parent) != KVT_OK)
          ++failures;
        got.push_back(r);
      }
      if (rng() % 3 == 0) {  // keep some across iterations, release them later
        held.insert(held.end(), got.begin(), got.end());
      } else if (kvt_block_release(m.get(), got.data(), got.size()) != KVT_OK) {
        ++failures;
      }
      if (held.size() > 64) {
        if (kvt_block_release(m.get(), held.data(), held.size()) != KVT_OK) ++failures;
        held.clear();
      }
      if (id == 0 && iter % 50 == 0) {
        kvt_event ev[256];
        kvt_poll(m.get(), ev, 256);
      }
      ++ops;
    }
    if (kvt_block_release(m.get(), held.data(), held.size()) != KVT_OK) ++failures;
  };
  std::vector<std::thread> ts;
  for (int i = 0; i < 4; ++i) ts.emplace_back(worker, i + 1);
  for (auto &t : ts) t.join();
  EXPECT_EQ(failures.load(), 0u);
  EXPECT_GT(ops.load(), 60000u);
  EXPECT_KVT(kvt_manager_check(m.get()), KVT_OK);
  for (kvt_tier t : {KVT_TIER_G1, KVT_TIER_G2}) {
    kvt_tier_stats s = stats(m.get(), t);
    EXPECT_EQ(s.free + s.active + s.inactive, s.capacity);
    EXPECT_EQ(s.active, 0u) << "every reference was released";
    EXPECT_GT(s.dedups + s.match_hit, 0u) << "threads never shared a prefix";
  }
}
