// Eviction that knows what matters: priorities (lower evicted first, the policy among
// equals), pins (never evicted, up to max_pinned_percent of the tier), the S3-FIFO policy,
// and kvt_tier_evictable_blocks telling the true eviction order.
#include <random>
#include <string>

#include "support.hpp"

using namespace kvt_test;

namespace {

kvt_manager_config config(uint64_t g1, kvt_eviction policy, uint32_t max_pinned = 50) {
  kvt_manager_config c = small_config(g1, 8);
  c.eviction[0] = policy;
  c.max_pinned_percent = max_pinned;
  return c;
}

// One registered block per hash, released at once (inactive), in order: the handles.
std::vector<kvt_block> put(kvt_manager *m, const std::vector<uint64_t> &hashes,
                           kvt_tier t = KVT_TIER_G1) {
  std::vector<kvt_block> out;
  for (uint64_t h : hashes) {
    kvt_block b = alloc(m, 1, t)[0];
    EXPECT_EQ(kvt_block_register_hash(&b, m, b, h, 0), KVT_OK) << kvt_last_error();
    EXPECT_EQ(kvt_block_release(m, &b, 1), KVT_OK) << kvt_last_error();
    out.push_back(b);
  }
  return out;
}

// A use of hash: true for a hit (matched and released), else it is stored and released.
bool use(kvt_manager *m, uint64_t h) {
  if (matched(m, KVT_TIER_G1, {h}) == 1) return true;
  put(m, {h});
  return false;
}

std::vector<uint64_t> evictable(kvt_manager *m, kvt_tier t = KVT_TIER_G1) {
  std::vector<kvt_block> b(stats(m, t).capacity);
  size_t n = 0;
  EXPECT_EQ(kvt_tier_evictable_blocks(b.data(), b.size(), &n, m, t), KVT_OK) << kvt_last_error();
  std::vector<uint64_t> h;
  for (size_t i = 0; i < n; ++i) h.push_back(info(m, b[i]).seq_hash);
  return h;
}

// Evicts every evictable block by allocating the whole tier's free and evictable space, and
// returns the hashes in the order the events say they left; the blocks allocated are freed.
std::vector<uint64_t> evict_all(kvt_manager *m, kvt_tier t = KVT_TIER_G1) {
  kvt_event ev[256];
  while (kvt_manager_poll(m, ev, 256) > 0) {
  }
  kvt_tier_stats s = stats(m, t);
  size_t n = s.free + (evictable(m, t).size());
  std::vector<kvt_block> b(n);
  if (n > 0) {
    EXPECT_EQ(kvt_block_alloc(b.data(), n, m, t), KVT_OK) << kvt_last_error();
  }
  std::vector<uint64_t> order;
  for (size_t k; (k = kvt_manager_poll(m, ev, 256)) > 0;)
    for (size_t i = 0; i < k; ++i)
      if (ev[i].type == KVT_EVENT_BLOCK_REMOVED && ev[i].tier == uint32_t(t))
        order.push_back(ev[i].hash);
  EXPECT_EQ(kvt_block_release(m, b.data(), n), KVT_OK) << kvt_last_error();
  return order;
}

std::vector<uint64_t> range(uint64_t from, uint64_t to) {
  std::vector<uint64_t> v;
  for (uint64_t h = from; h < to; ++h) v.push_back(h);
  return v;
}

}  // namespace

TEST(Eviction, LowerPriorityFirstThenLeastRecentlyReleased) {
  for (kvt_eviction policy : {KVT_EVICT_LRU, KVT_EVICT_S3FIFO}) {
    auto m = make(config(8, policy));
    auto b = put(m.get(), {1, 2, 3, 4, 5, 6});
    ASSERT_KVT_OK(kvt_block_set_priority(m.get(), &b[1], 1, 5));   // hash 2
    ASSERT_KVT_OK(kvt_block_set_priority(m.get(), &b[3], 1, -1));  // hash 4
    ASSERT_KVT_OK(kvt_block_set_priority(m.get(), &b[4], 1, 5));   // hash 5
    std::vector<uint64_t> want = {4, 1, 3, 6, 2, 5};
    EXPECT_EQ(evictable(m.get()), want) << policy;
    ASSERT_KVT_OK(kvt_manager_check(m.get()));
    EXPECT_EQ(evict_all(m.get()), want) << policy;
    ASSERT_KVT_OK(kvt_manager_check(m.get()));
  }
}

TEST(Eviction, PriorityOfAnActiveBlockAppliesAtItsRelease) {
  auto m = make(config(8, KVT_EVICT_LRU));
  put(m.get(), {1, 2});
  auto held = store(m.get(), {3});
  ASSERT_KVT_OK(kvt_block_set_priority(m.get(), held.data(), 1, -7));
  EXPECT_EQ(evictable(m.get()), (std::vector<uint64_t>{1, 2}));
  ASSERT_KVT_OK(kvt_block_release(m.get(), held.data(), 1));
  EXPECT_EQ(evictable(m.get()), (std::vector<uint64_t>{3, 1, 2}));
  // Back to 0: it joins the most recent end of priority 0.
  ASSERT_KVT_OK(kvt_block_set_priority(m.get(), held.data(), 1, 0));
  EXPECT_EQ(evictable(m.get()), (std::vector<uint64_t>{1, 2, 3}));
  ASSERT_KVT_OK(kvt_manager_check(m.get()));
}

TEST(Eviction, PinnedBlocksAreNeverEvicted) {
  for (kvt_eviction policy : {KVT_EVICT_LRU, KVT_EVICT_S3FIFO}) {
    auto m = make(config(8, policy));
    auto b = put(m.get(), range(1, 9));
    kvt_block pins[3] = {b[0], b[4], b[7]};  // hashes 1, 5, 8
    ASSERT_KVT_OK(kvt_block_pin(m.get(), pins, 3));
    EXPECT_EQ(stats(m.get(), KVT_TIER_G1).pinned, 3u);
    EXPECT_EQ(evictable(m.get()), (std::vector<uint64_t>{2, 3, 4, 6, 7}));
    auto taken = alloc(m.get(), 5);
    std::vector<kvt_block> more(1);
    EXPECT_KVT(kvt_block_alloc(more.data(), 1, m.get(), KVT_TIER_G1), KVT_ERR_NO_SPACE);
    EXPECT_NE(std::string(kvt_last_error()).find("3 pinned"), std::string::npos)
        << kvt_last_error();
    for (uint64_t h : {1, 5, 8}) EXPECT_EQ(matched(m.get(), KVT_TIER_G1, {h}), 1u) << h;
    // Matched and released again, still pinned: not evictable.
    EXPECT_TRUE(evictable(m.get()).empty());
    EXPECT_EQ(stats(m.get(), KVT_TIER_G1).inactive, 3u);
    ASSERT_KVT_OK(kvt_manager_check(m.get()));
    ASSERT_KVT_OK(kvt_block_release(m.get(), taken.data(), taken.size()));
  }
}

TEST(Eviction, PinPastTheShareIsRefusedWholly) {
  auto m = make(config(10, KVT_EVICT_LRU, 30));  // at most 3 pinned
  auto b = put(m.get(), range(1, 7));
  ASSERT_KVT_OK(kvt_block_pin(m.get(), b.data(), 2));
  kvt_block two[2] = {b[2], b[3]};
  EXPECT_KVT(kvt_block_pin(m.get(), two, 2), KVT_ERR_NO_SPACE);
  std::string msg = kvt_last_error();
  EXPECT_NE(msg.find("max_pinned_percent"), std::string::npos) << msg;
  EXPECT_NE(msg.find("30%"), std::string::npos) << msg;
  EXPECT_EQ(stats(m.get(), KVT_TIER_G1).pinned, 2u);
  EXPECT_EQ(evictable(m.get()), (std::vector<uint64_t>{3, 4, 5, 6}));
  // Pinned already, or listed twice: counted once.
  kvt_block again[4] = {b[0], b[1], b[2], b[2]};
  ASSERT_KVT_OK(kvt_block_pin(m.get(), again, 4));
  EXPECT_EQ(stats(m.get(), KVT_TIER_G1).pinned, 3u);
  EXPECT_KVT(kvt_block_pin(m.get(), &b[5], 1), KVT_ERR_NO_SPACE);
  ASSERT_KVT_OK(kvt_manager_check(m.get()));

  auto none = make(config(10, KVT_EVICT_LRU, 0));
  auto c = put(none.get(), {1});
  EXPECT_KVT(kvt_block_pin(none.get(), c.data(), 1), KVT_ERR_NO_SPACE);
  EXPECT_EQ(stats(none.get(), KVT_TIER_G1).pinned, 0u);
}

TEST(Eviction, UnpinMakesABlockEvictableAgain) {
  for (kvt_eviction policy : {KVT_EVICT_LRU, KVT_EVICT_S3FIFO}) {
    auto m = make(config(8, policy));
    auto b = put(m.get(), {1, 2, 3});
    ASSERT_KVT_OK(kvt_block_pin(m.get(), &b[0], 1));
    EXPECT_EQ(evictable(m.get()), (std::vector<uint64_t>{2, 3}));
    ASSERT_KVT_OK(kvt_block_unpin(m.get(), &b[0], 1));
    ASSERT_KVT_OK(kvt_block_unpin(m.get(), &b[0], 1));  // not pinned: nothing to do
    EXPECT_EQ(stats(m.get(), KVT_TIER_G1).pinned, 0u);
    EXPECT_EQ(evictable(m.get()), (std::vector<uint64_t>{2, 3, 1}));  // as if released now
    EXPECT_EQ(evict_all(m.get()), (std::vector<uint64_t>{2, 3, 1}));
    ASSERT_KVT_OK(kvt_manager_check(m.get()));
  }
}

TEST(Eviction, PinsAndPrioritiesLeaveWithTheBlock) {
  auto m = make(config(4, KVT_EVICT_LRU, 100));
  auto b = put(m.get(), {1, 2});
  ASSERT_KVT_OK(kvt_block_set_priority(m.get(), &b[0], 1, 9));
  ASSERT_KVT_OK(kvt_block_unpin(m.get(), &b[0], 1));
  EXPECT_EQ(evict_all(m.get()), (std::vector<uint64_t>{2, 1}));
  EXPECT_KVT(kvt_block_pin(m.get(), &b[0], 1), KVT_ERR_INVALID_HANDLE);  // evicted: stale
  // A slot used again starts at priority 0, unpinned.
  auto c = put(m.get(), {3, 4});
  EXPECT_EQ(evictable(m.get()), (std::vector<uint64_t>{3, 4}));
  ASSERT_KVT_OK(kvt_block_pin(m.get(), c.data(), 2));
  EXPECT_EQ(evict_all(m.get()), std::vector<uint64_t>{});
  EXPECT_EQ(stats(m.get(), KVT_TIER_G1).pinned, 2u);
  ASSERT_KVT_OK(kvt_manager_check(m.get()));
}

TEST(Eviction, BadBlocksAreRefusedAndChangeNothing) {
  auto m = make(config(8, KVT_EVICT_LRU));
  auto b = put(m.get(), {1, 2});
  auto empty = alloc(m.get(), 1);
  kvt_block freed = alloc(m.get(), 1)[0];
  ASSERT_KVT_OK(kvt_block_release(m.get(), &freed, 1));
  for (auto call : {+[](kvt_manager *m, const kvt_block *b, size_t n) {
                      return kvt_block_set_priority(m, b, n, -3);
                    },
                    +[](kvt_manager *m, const kvt_block *b, size_t n) {
                      return kvt_block_pin(m, b, n);
                    },
                    +[](kvt_manager *m, const kvt_block *b, size_t n) {
                      return kvt_block_unpin(m, b, n);
                    }}) {
    kvt_block with_empty[2] = {b[1], empty[0]};
    EXPECT_KVT(call(m.get(), with_empty, 2), KVT_ERR_STATE);
    EXPECT_NE(std::string(kvt_last_error()).find("blocks[1]"), std::string::npos);
    kvt_block with_stale[2] = {b[1], freed};
    EXPECT_KVT(call(m.get(), with_stale, 2), KVT_ERR_INVALID_HANDLE);
    kvt_block zero = 0;
    EXPECT_KVT(call(m.get(), &zero, 1), KVT_ERR_INVALID_HANDLE);
    EXPECT_KVT(call(m.get(), nullptr, 1), KVT_ERR_INVALID_ARGUMENT);
    EXPECT_KVT(call(nullptr, b.data(), 1), KVT_ERR_INVALID_ARGUMENT);
    EXPECT_KVT(call(m.get(), nullptr, 0), KVT_OK);
    EXPECT_EQ(evictable(m.get()), (std::vector<uint64_t>{1, 2}));
    EXPECT_EQ(stats(m.get(), KVT_TIER_G1).pinned, 0u);
  }
  ASSERT_KVT_OK(kvt_manager_check(m.get()));
  ASSERT_KVT_OK(kvt_block_release(m.get(), empty.data(), 1));
}

TEST(Eviction, ArraysMayMixTiers) {
  kvt_manager_config c = config(8, KVT_EVICT_LRU, 25);  // two of each tier's 8
  auto m = make(c);
  auto g1 = put(m.get(), {1, 2, 3});
  auto g2 = put(m.get(), {11, 12, 13}, KVT_TIER_G2);
  kvt_block both[2] = {g2[0], g1[0]};
  ASSERT_KVT_OK(kvt_block_pin(m.get(), both, 2));
  ASSERT_KVT_OK(kvt_block_set_priority(m.get(), both, 2, 1));
  EXPECT_EQ(evictable(m.get(), KVT_TIER_G2), (std::vector<uint64_t>{12, 13}));
  // G2 has room for one more pin, G1 too; two more in G2 is refused, and so is the G1 pin
  // listed with them.
  kvt_block over[3] = {g1[1], g2[1], g2[2]};
  EXPECT_KVT(kvt_block_pin(m.get(), over, 3), KVT_ERR_NO_SPACE);
  EXPECT_NE(std::string(kvt_last_error()).find("G2"), std::string::npos);
  EXPECT_EQ(stats(m.get(), KVT_TIER_G1).pinned, 1u);
  EXPECT_EQ(stats(m.get(), KVT_TIER_G2).pinned, 1u);
  ASSERT_KVT_OK(kvt_block_unpin(m.get(), both, 2));
  EXPECT_EQ(evictable(m.get(), KVT_TIER_G2), (std::vector<uint64_t>{12, 13, 11}));
  ASSERT_KVT_OK(kvt_manager_check(m.get()));
}

// A hot working set used between passes of a looping scan larger than the tier: LRU
// evicts it on every pass, S3-FIFO keeps it in its main queue and lets the scan churn
// through the small one.
TEST(Eviction, S3FifoKeepsAHotSetThroughALoopingScan) {
  const uint64_t capacity = 100, hot = 10, loop = 300, pass = 150;
  size_t hot_hits[2] = {};
  for (kvt_eviction policy : {KVT_EVICT_LRU, KVT_EVICT_S3FIFO}) {
    auto m = make(config(capacity, policy));
    for (int warm = 0; warm < 3; ++warm)
      for (uint64_t h = 1; h <= hot; ++h) use(m.get(), h);
    uint64_t next = 0;
    for (int round = 0; round < 10; ++round) {
      for (uint64_t i = 0; i < pass; ++i, next = (next + 1) % loop) use(m.get(), 1000 + next);
      for (uint64_t h = 1; h <= hot; ++h) hot_hits[policy] += use(m.get(), h);
    }
    ASSERT_KVT_OK(kvt_manager_check(m.get()));
  }
  EXPECT_EQ(hot_hits[KVT_EVICT_LRU], 0u);
  EXPECT_EQ(hot_hits[KVT_EVICT_S3FIFO], 10 * hot);
}

// Random uses, releases, pins, unpins and priorities with a fixed seed; after each step the
// invariants hold, and at the end kvt_tier_evictable_blocks names the blocks in the order that
// eviction then takes them.
TEST(Eviction, RandomOperationsKeepInvariantsAndTheOrder) {
  for (kvt_eviction policy : {KVT_EVICT_LRU, KVT_EVICT_S3FIFO}) {
    auto m = make(config(32, policy, 25));
    std::mt19937 rng(15);
    std::vector<kvt_block> held;
    std::vector<kvt_block> known;  // handles that were registered, maybe stale by now
    for (int step = 0; step < 3000; ++step) {
      uint64_t h = 1 + rng() % 60;
      switch (rng() % 7) {
        case 0:
        case 1: {  // a use: matched or stored, held for a while
          std::vector<kvt_block> got;
          if (matched(m.get(), KVT_TIER_G1, {h}, &got) == 0 && held.size() < 20) {
            kvt_block b = 0;
            if (kvt_block_alloc(&b, 1, m.get(), KVT_TIER_G1) != KVT_OK) break;
            ASSERT_KVT_OK(kvt_block_register_hash(&b, m.get(), b, h, 0));
            got = {b};
          }
          held.insert(held.end(), got.begin(), got.end());
          known.insert(known.end(), got.begin(), got.end());
          break;
        }
        case 2:
        case 3:
          if (!held.empty()) {
            size_t i = rng() % held.size();
            ASSERT_KVT_OK(kvt_block_release(m.get(), &held[i], 1));
            held.erase(held.begin() + i);
          }
          break;
        case 4:
        case 5:
        case 6:
          if (!known.empty()) {
            kvt_block b[2] = {known[rng() % known.size()], known[rng() % known.size()]};
            int op = rng() % 3;
            kvt_status s = op == 0   ? kvt_block_pin(m.get(), b, 2)
                           : op == 1 ? kvt_block_unpin(m.get(), b, 2)
                                     : kvt_block_set_priority(m.get(), b, 2, int(rng() % 4) - 1);
            ASSERT_TRUE(s == KVT_OK || s == KVT_ERR_INVALID_HANDLE ||
                        (op == 0 && s == KVT_ERR_NO_SPACE))
                << kvt_status_str(s) << ": " << kvt_last_error();
          }
          break;
      }
      ASSERT_EQ(kvt_manager_check(m.get()), KVT_OK) << "step " << step << ": " << kvt_last_error();
    }
    EXPECT_GT(stats(m.get(), KVT_TIER_G1).pinned, 0u);
    EXPECT_GT(stats(m.get(), KVT_TIER_G1).evictions, 100u);
    auto want = evictable(m.get());
    EXPECT_GT(want.size(), 4u);
    EXPECT_EQ(evict_all(m.get()), want) << policy;
    ASSERT_KVT_OK(kvt_block_release(m.get(), held.data(), held.size()));
    ASSERT_KVT_OK(kvt_manager_check(m.get()));
  }
}

// S3-FIFO's own order: blocks used again are in main and outlast one-time blocks; main's
// blocks leave by how often they were used, and a ghost hit goes straight to main.
TEST(Eviction, S3FifoOrdersByUse) {
  auto m = make(config(20, KVT_EVICT_S3FIFO));
  put(m.get(), range(1, 11));                   // 1..10 in the small queue
  for (uint64_t h : {3, 7}) use(m.get(), h);    // used again: main, frequency 0
  for (uint64_t h : {7}) use(m.get(), h);       // used again in main: frequency 1
  // small holds 8 of 10: its turn until it falls under a tenth; then main, 3 before 7.
  EXPECT_EQ(evictable(m.get()), (std::vector<uint64_t>{1, 2, 4, 5, 6, 8, 9, 10, 3, 7}));
  EXPECT_EQ(evict_all(m.get()), (std::vector<uint64_t>{1, 2, 4, 5, 6, 8, 9, 10, 3, 7}));
  // 1 left the small queue unused: its ghost sends it to main when it comes back, where it
  // outlasts the newcomers of the small queue.
  put(m.get(), {1});
  put(m.get(), range(30, 39));
  EXPECT_EQ(evictable(m.get()).back(), 1u);
  ASSERT_KVT_OK(kvt_manager_check(m.get()));
}
