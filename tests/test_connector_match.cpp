// The connector's hits: a prefix whose blocks lie in G2 and G3 both; a sliding-window
// connector (one KV cache group of a hybrid model), whose hit needs only the blocks of the
// window before its end (vLLM's SlidingWindowManager); the capped match that groups use to
// agree on one hit; null blocks; what the config refuses.
#include <gtest/gtest.h>

#include "connector_support.hpp"

namespace {
using namespace kvt_conn_test;

constexpr uint32_t kWindow = 40;  // tokens: cdiv(39, 16) = 3 blocks

struct WindowRig {
  kvt_test::TempDir dir;
  kvt_manager *m = nullptr;
  kvt_connector *c = nullptr;
  std::vector<uint32_t> tokens = token_range(1000, 150);  // 9 full blocks a hit may use
  std::vector<uint64_t> h = hashes_of(tokens);

  explicit WindowRig(uint32_t window = kWindow) {
    kvt_manager_config mc = seed_manager_config(50, 50, dir.path.c_str());
    EXPECT_EQ(kvt_manager_create(&m, &mc), KVT_OK);
    kvt_connector_config cc = connector_config(KVT_ROLE_SCHEDULER);
    cc.sliding_window = window;
    EXPECT_EQ(kvt_connector_create(&c, m, &cc), KVT_OK) << kvt_last_error();
  }
  ~WindowRig() {
    kvt_connector_destroy(c);
    kvt_manager_destroy(m);
  }
  // Blocks [first, last) of the tokens in the tier.
  void store(size_t first, size_t last, kvt_tier tier = KVT_TIER_G2) {
    for (size_t j = first; j < last; ++j) {
      kvt_block b = 0, out = 0;
      ASSERT_EQ(kvt_block_alloc(&b, 1, m, tier), KVT_OK);
      ASSERT_EQ(kvt_block_register_hash(&out, m, b, h[j], j ? h[j - 1] : 0), KVT_OK);
      ASSERT_EQ(kvt_block_release(m, &out, 1), KVT_OK);
    }
  }
  uint64_t match(const char *id, uint64_t computed = 0, uint64_t max = UINT64_MAX) {
    uint64_t n = 0;
    uint64_t salt = 0;
    EXPECT_EQ(kvt_hash_salt(&salt, nullptr, 0), KVT_OK);
    EXPECT_EQ(kvt_connector_get_num_new_matched_tokens_max(&n, nullptr, c, id, salt,
                                                          tokens.data(), tokens.size(),
                                                          computed, max),
              KVT_OK)
        << kvt_last_error();
    return n;
  }
};

TEST(ConnectorMatch, APrefixTakesEachBlockFromG2ElseG3) {
  // Eviction moved blocks 0-2 down to G3; 3-5 are in G2, 6 in both, 7 in G3 again.
  WindowRig r(0);
  r.store(0, 3, KVT_TIER_G3);
  r.store(3, 7);
  r.store(6, 8, KVT_TIER_G3);
  EXPECT_EQ(r.match("A"), 8u * kPage);
  WindowRig gap(0);
  gap.store(0, 3, KVT_TIER_G3);
  gap.store(4, 7);  // block 3 is nowhere: the prefix ends there
  EXPECT_EQ(gap.match("A"), 3u * kPage);
}

TEST(ConnectorMatch, AHitNeedsOnlyTheBlocksOfItsWindow) {
  WindowRig r;
  r.store(5, 9);  // blocks 0-4 are nowhere
  EXPECT_EQ(r.match("A"), 9u * kPage);
  // Only the window's 3 blocks are loaded, into the blocks the engine gave for them; the
  // others are its null blocks.
  std::vector<uint32_t> ids(10, KVT_BLOCK_ID_NONE);
  for (uint32_t j = 6; j < 10; ++j) ids[j] = 20 + j;
  ASSERT_EQ(kvt_connector_update_state_after_alloc(r.c, "A", ids.data(), ids.size(),
                                                   9 * kPage),
            KVT_OK)
      << kvt_last_error();
  kvt_scheduled_request q{"A", 9 * kPage, 6, nullptr, 0, nullptr, 0};
  const void *meta = nullptr;
  size_t len = 0;
  ASSERT_EQ(kvt_connector_build_connector_meta(&meta, &len, r.c, &q, 1), KVT_OK)
      << kvt_last_error();
  EXPECT_EQ(cstats(r.c).matched_tokens, 9u * kPage);
}

TEST(ConnectorMatch, AHoleInsideTheWindowEndsTheHitBeforeIt) {
  WindowRig r;
  r.store(0, 7);
  r.store(8, 9);  // block 7 is nowhere: an end at 9 or 8 would need it
  EXPECT_EQ(r.match("A"), 7u * kPage);  // the window before 7 (blocks 4-6) is whole
}

TEST(ConnectorMatch, ACapLowersTheHitToAWindowThatFitsBelowIt) {
  WindowRig r;
  r.store(0, 2);
  r.store(4, 9);  // blocks 2 and 3 are nowhere
  EXPECT_EQ(r.match("A"), 9u * kPage);
  // Capped at 6 blocks: the window before 6 (3-5) misses block 3; before 5 too (2-4); 2
  // blocks from the start are a hit (the window reaches back past the first block).
  EXPECT_EQ(r.match("A", 0, 6 * kPage), 2u * kPage);
  // Without a window the same cap gives the prefix only.
  WindowRig full(0);
  full.store(0, 9);
  EXPECT_EQ(full.match("B", 0, 6 * kPage), 6u * kPage);
}

TEST(ConnectorMatch, LazyOffloadAndReservedFieldsAreRefused) {
  kvt_manager *m = nullptr;
  kvt_manager_config mc = seed_manager_config();
  ASSERT_EQ(kvt_manager_create(&m, &mc), KVT_OK);
  kvt_connector *c = nullptr;
  kvt_connector_config cc = connector_config(KVT_ROLE_SCHEDULER, KVT_OFFLOAD_LAZY);
  cc.sliding_window = kWindow;
  EXPECT_EQ(kvt_connector_create(&c, m, &cc), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kvt_last_error()).find("lazy"), std::string::npos) << kvt_last_error();
  cc = connector_config(KVT_ROLE_SCHEDULER);
  cc.reserved3 = 1;
  EXPECT_EQ(kvt_connector_create(&c, m, &cc), KVT_ERR_INVALID_ARGUMENT);
  kvt_manager_destroy(m);
}

}  // namespace
