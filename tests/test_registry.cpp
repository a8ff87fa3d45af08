// Registry, dedup, prefix match, reference counts, eviction order and handle checks.
#include "support.hpp"

using namespace kvt_test;

TEST(Registry, DedupReturnsExistingBlockAndFreesTheNewOne) {
  auto m = make(small_config(4, 0));
  kvt_block first = store(m.get(), {100})[0];
  kvt_block b = alloc(m.get(), 1)[0], r = 0;
  drain(m.get());
  ASSERT_KVT_OK(kvt_block_register_hash(&r, m.get(), b, 100, 0));
  EXPECT_EQ(r, first);
  EXPECT_EQ(info(m.get(), first).refs, 2u);
  kvt_tier_stats s = stats(m.get(), KVT_TIER_G1);
  EXPECT_EQ(s.free, 3u);
  EXPECT_EQ(s.active, 1u);
  EXPECT_EQ(s.dedups, 1u);
  EXPECT_EQ(s.registered, 1u);
  // The new block's handle is stale now, and dedup emitted nothing.
  EXPECT_KVT(kvt_block_release(m.get(), &b, 1), KVT_ERR_INVALID_HANDLE);
  EXPECT_TRUE(drain(m.get()).empty());
  EXPECT_KVT(kvt_manager_check(m.get()), KVT_OK);
}

TEST(Registry, DedupRevivesAnInactiveBlock) {
  auto m = make(small_config(4, 0));
  kvt_block first = store(m.get(), {100})[0];
  ASSERT_KVT_OK(kvt_block_release(m.get(), &first, 1));
  EXPECT_EQ(state_of(m.get(), first), uint32_t(KVT_BLOCK_INACTIVE));
  kvt_block b = alloc(m.get(), 1)[0], r = 0;
  ASSERT_KVT_OK(kvt_block_register_hash(&r, m.get(), b, 100, 0));
  EXPECT_EQ(r, first);
  EXPECT_EQ(state_of(m.get(), first), uint32_t(KVT_BLOCK_REGISTERED));
  EXPECT_EQ(stats(m.get(), KVT_TIER_G1).inactive, 0u);
  EXPECT_KVT(kvt_manager_check(m.get()), KVT_OK);
}

TEST(Registry, PrefixMatchFullPartialAndMiss) {
  auto m = make(small_config(8, 0));
  auto blocks = store(m.get(), {1, 2, 3});
  kvt_block out[5] = {};
  size_t n = 99;
  const uint64_t full[3] = {1, 2, 3}, partial[5] = {1, 2, 9, 3, 4}, miss[2] = {9, 1};
  ASSERT_KVT_OK(kvt_tier_match_prefix(&n, out, m.get(), KVT_TIER_G1, full, 3));
  EXPECT_EQ(n, 3u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(out[i], blocks[i]);
  ASSERT_KVT_OK(kvt_tier_match_prefix(&n, out, m.get(), KVT_TIER_G1, partial, 5));
  EXPECT_EQ(n, 2u);  // stops at the first hash not present, even if later ones are
  ASSERT_KVT_OK(kvt_tier_match_prefix(&n, out, m.get(), KVT_TIER_G1, miss, 2));
  EXPECT_EQ(n, 0u);
  ASSERT_KVT_OK(kvt_tier_match_prefix(&n, nullptr, m.get(), KVT_TIER_G1, nullptr, 0));
  EXPECT_EQ(n, 0u);
  // Pins: 1 from store + 2 matches for blocks 0 and 1, 1 + 1 for block 2.
  EXPECT_EQ(info(m.get(), blocks[0]).refs, 3u);
  EXPECT_EQ(info(m.get(), blocks[1]).refs, 3u);
  EXPECT_EQ(info(m.get(), blocks[2]).refs, 2u);
  kvt_tier_stats s = stats(m.get(), KVT_TIER_G1);
  EXPECT_EQ(s.match_queried, 10u);
  EXPECT_EQ(s.match_hit, 5u);
}

TEST(Registry, MatchPinsInactiveBlocksAndMissesAfterEviction) {
  auto m = make(small_config(4, 0));
  auto blocks = store(m.get(), {1, 2, 3, 4});
  ASSERT_KVT_OK(kvt_block_release(m.get(), blocks.data(), 4));
  EXPECT_EQ(stats(m.get(), KVT_TIER_G1).inactive, 4u);
  // Evict two (the tail: 4 then 3), then the prefix is 2 long.
  auto fresh = alloc(m.get(), 2);
  kvt_block out[4];
  size_t n = 0;
  const uint64_t h[4] = {1, 2, 3, 4};
  ASSERT_KVT_OK(kvt_tier_match_prefix(&n, out, m.get(), KVT_TIER_G1, h, 4));
  EXPECT_EQ(n, 2u);
  EXPECT_EQ(out[0], blocks[0]);
  EXPECT_EQ(out[1], blocks[1]);
  EXPECT_EQ(state_of(m.get(), out[0]), uint32_t(KVT_BLOCK_REGISTERED));
  kvt_tier_stats s = stats(m.get(), KVT_TIER_G1);
  EXPECT_EQ(s.inactive, 0u);
  EXPECT_EQ(s.active, 4u);
  // Matched blocks cannot be evicted while pinned: the tier is full.
  kvt_block extra;
  EXPECT_KVT(kvt_block_alloc(&extra, 1, m.get(), KVT_TIER_G1), KVT_ERR_NO_SPACE);
  EXPECT_KVT(kvt_manager_check(m.get()), KVT_OK);
}

TEST(Registry, ReferenceCountsAcrossMatchAndRelease) {
  auto m = make(small_config(4, 0));
  kvt_block b = store(m.get(), {7})[0];
  kvt_block out[1];
  size_t n;
  const uint64_t h = 7;
  for (int i = 0; i < 3; ++i)
    ASSERT_KVT_OK(kvt_tier_match_prefix(&n, out, m.get(), KVT_TIER_G1, &h, 1));
  EXPECT_EQ(info(m.get(), b).refs, 4u);
  ASSERT_KVT_OK(kvt_block_retain(m.get(), b));
  EXPECT_EQ(info(m.get(), b).refs, 5u);
  kvt_block many[4] = {b, b, b, b};
  ASSERT_KVT_OK(kvt_block_release(m.get(), many, 4));  // one handle, four references
  EXPECT_EQ(info(m.get(), b).refs, 1u);
  EXPECT_EQ(state_of(m.get(), b), uint32_t(KVT_BLOCK_REGISTERED));
  ASSERT_KVT_OK(kvt_block_release(m.get(), &b, 1));
  EXPECT_EQ(state_of(m.get(), b), uint32_t(KVT_BLOCK_INACTIVE));
  // No reference left: another release is a state error and changes nothing.
  Snapshot before(m.get());
  EXPECT_KVT(kvt_block_release(m.get(), &b, 1), KVT_ERR_STATE);
  EXPECT_TRUE(Snapshot(m.get()) == before);
  // Retain revives it.
  ASSERT_KVT_OK(kvt_block_retain(m.get(), b));
  EXPECT_EQ(state_of(m.get(), b), uint32_t(KVT_BLOCK_REGISTERED));
  EXPECT_KVT(kvt_manager_check(m.get()), KVT_OK);
}

TEST(Registry, ReleaseIsAllOrNothing) {
  auto m = make(small_config(4, 0));
  auto blocks = store(m.get(), {1, 2});
  kvt_block mixed[3] = {blocks[0], blocks[1], 0x1234};
  Snapshot before(m.get());
  EXPECT_KVT(kvt_block_release(m.get(), mixed, 3), KVT_ERR_INVALID_HANDLE);
  EXPECT_TRUE(Snapshot(m.get()) == before);
  EXPECT_EQ(info(m.get(), blocks[0]).refs, 1u);
  // Three references asked of a block that holds two: none is dropped.
  kvt_block r = 0, fresh = alloc(m.get(), 1)[0];
  ASSERT_KVT_OK(kvt_block_register_hash(&r, m.get(), fresh, 1, 0));
  kvt_block triple[3] = {blocks[0], blocks[0], blocks[0]};
  EXPECT_KVT(kvt_block_release(m.get(), triple, 3), KVT_ERR_STATE);
  EXPECT_EQ(info(m.get(), blocks[0]).refs, 2u);
  EXPECT_KVT(kvt_manager_check(m.get()), KVT_OK);
}

// Eviction order of DESIGN section 2, observed through BLOCK_REMOVED events.
TEST(Eviction, TailFirstWithinOneReleaseAndLruAcrossCalls) {
  auto m = make(small_config(6, 0));
  auto a = store(m.get(), {11, 12, 13});  // request A
  auto b = store(m.get(), {21, 22, 23});  // request B
  ASSERT_KVT_OK(kvt_block_release(m.get(), a.data(), 3));  // released first
  ASSERT_KVT_OK(kvt_block_release(m.get(), b.data(), 3));
  drain(m.get());
  std::vector<uint64_t> order;
  for (int i = 0; i < 6; ++i) {
    alloc(m.get(), 1);
    for (const kvt_event &e : drain(m.get())) {
      ASSERT_EQ(e.type, uint32_t(KVT_EVENT_BLOCK_REMOVED));
      EXPECT_EQ(e.tier, uint32_t(KVT_TIER_G1));
      order.push_back(e.hash);
    }
  }
  EXPECT_EQ(order, (std::vector<uint64_t>{13, 12, 11, 23, 22, 21}));
  EXPECT_EQ(stats(m.get(), KVT_TIER_G1).evictions, 6u);
}

// kvt_tier_evictable_blocks names the victims of the next allocations, in order, and how many
// there are, and changes nothing.
TEST(Eviction, EvictableListsTheNextVictimsInOrder) {
  auto m = make(small_config(6, 0));
  auto a = store(m.get(), {11, 12, 13});
  auto b = store(m.get(), {21, 22});
  ASSERT_KVT_OK(kvt_block_release(m.get(), a.data(), 3));
  kvt_block out[8];
  size_t n = 99;
  ASSERT_KVT_OK(kvt_tier_evictable_blocks(out, 8, &n, m.get(), KVT_TIER_G1));
  ASSERT_EQ(n, 3u);
  EXPECT_EQ(out[0], a[2]);
  EXPECT_EQ(out[1], a[1]);
  EXPECT_EQ(out[2], a[0]);
  out[2] = 0;
  ASSERT_KVT_OK(kvt_tier_evictable_blocks(out, 2, &n, m.get(), KVT_TIER_G1));
  EXPECT_EQ(n, 3u);  // all of them, of which out holds the first two
  EXPECT_EQ(out[0], a[2]);
  EXPECT_EQ(out[1], a[1]);
  EXPECT_EQ(out[2], 0u);
  n = 99;
  ASSERT_KVT_OK(kvt_tier_evictable_blocks(nullptr, 0, &n, m.get(), KVT_TIER_G1));
  EXPECT_EQ(n, 3u);
  EXPECT_EQ(stats(m.get(), KVT_TIER_G1).inactive, 3u);
  drain(m.get());
  alloc(m.get(), 2);  // one never-used slot, then the first victim
  auto ev = drain(m.get());
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].hash, 13u);
  EXPECT_KVT(kvt_tier_evictable_blocks(out, 8, nullptr, m.get(), KVT_TIER_G1),
             KVT_ERR_INVALID_ARGUMENT);
  EXPECT_KVT(kvt_tier_evictable_blocks(nullptr, 8, &n, m.get(), KVT_TIER_G1),
             KVT_ERR_INVALID_ARGUMENT);
  EXPECT_KVT(kvt_tier_evictable_blocks(out, 8, &n, m.get(), KVT_TIER_G3),
             KVT_ERR_INVALID_ARGUMENT);
  ASSERT_KVT_OK(kvt_block_release(m.get(), b.data(), 2));
  EXPECT_KVT(kvt_manager_check(m.get()), KVT_OK);
}

TEST(Eviction, NeverRegisteredFreeSlotsGoFirst) {
  auto m = make(small_config(4, 0));
  auto a = store(m.get(), {1, 2});
  ASSERT_KVT_OK(kvt_block_release(m.get(), a.data(), 2));
  drain(m.get());
  alloc(m.get(), 2);  // the two never-used slots
  EXPECT_TRUE(drain(m.get()).empty());
  EXPECT_EQ(stats(m.get(), KVT_TIER_G1).inactive, 2u);
  alloc(m.get(), 1);
  auto ev = drain(m.get());
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].hash, 2u);
}

TEST(Eviction, RematchedBlockMovesToTheBackOfTheQueue) {
  auto m = make(small_config(3, 0));
  auto a = store(m.get(), {1});
  auto b = store(m.get(), {2});
  auto c = store(m.get(), {3});
  for (auto *v : {&a, &b, &c}) ASSERT_KVT_OK(kvt_block_release(m.get(), v->data(), 1));
  // Match 1 and release it again: now 2 is the least recently released.
  kvt_block out;
  size_t n;
  const uint64_t h = 1;
  ASSERT_KVT_OK(kvt_tier_match_prefix(&n, &out, m.get(), KVT_TIER_G1, &h, 1));
  ASSERT_KVT_OK(kvt_block_release(m.get(), &out, 1));
  drain(m.get());
  alloc(m.get(), 3);
  std::vector<uint64_t> order;
  for (auto &e : drain(m.get())) order.push_back(e.hash);
  EXPECT_EQ(order, (std::vector<uint64_t>{2, 3, 1}));
}

TEST(Handles, StaleForgedZeroAndForeignAreRefused) {
  auto m = make(small_config(4, 0));
  auto other = make(small_config(4, 0));
  kvt_block b = alloc(m.get(), 1)[0];
  kvt_block theirs = alloc(other.get(), 1)[0];
  ASSERT_KVT_OK(kvt_block_release(m.get(), &b, 1));
  kvt_block again = alloc(m.get(), 1)[0];  // reuses the slot with a new generation
  EXPECT_NE(again, b);
  Snapshot before(m.get());
  for (kvt_block bad : {b, kvt_block{0}, kvt_block{0xdeadbeefULL}, ~kvt_block{0}, theirs,
                        again + 1, again ^ (uint64_t{1} << 63)}) {
    SCOPED_TRACE(bad);
    kvt_block r;
    EXPECT_KVT(kvt_block_release(m.get(), &bad, 1), KVT_ERR_INVALID_HANDLE);
    EXPECT_KVT(kvt_block_register_hash(&r, m.get(), bad, 5, 0), KVT_ERR_INVALID_HANDLE);
    EXPECT_KVT(kvt_block_init(m.get(), bad, 0, 0), KVT_ERR_INVALID_HANDLE);
    EXPECT_KVT(kvt_block_retain(m.get(), bad), KVT_ERR_INVALID_HANDLE);
    void *p;
    size_t len;
    EXPECT_KVT(kvt_block_data(&p, &len, m.get(), bad), KVT_ERR_INVALID_HANDLE);
    EXPECT_STRNE(kvt_last_error(), "no error");
  }
  EXPECT_TRUE(Snapshot(m.get()) == before);
  EXPECT_EQ(state_of(m.get(), again), uint32_t(KVT_BLOCK_EMPTY));
  EXPECT_EQ(state_of(other.get(), theirs), uint32_t(KVT_BLOCK_EMPTY));
}

TEST(Handles, EvictedBlockHandleGoesStale) {
  auto m = make(small_config(1, 0));
  kvt_block a = store(m.get(), {1})[0];
  ASSERT_KVT_OK(kvt_block_release(m.get(), &a, 1));
  alloc(m.get(), 1);  // evicts a
  EXPECT_KVT(kvt_block_retain(m.get(), a), KVT_ERR_INVALID_HANDLE);
}

TEST(Tiers, CapacityRequestLargerThanTierLeaksNothing) {
  auto m = make(small_config(4, 4));
  auto held = store(m.get(), {1});
  Snapshot before(m.get());
  std::vector<kvt_block> out(5, 0);
  EXPECT_KVT(kvt_block_alloc(out.data(), 4, m.get(), KVT_TIER_G1), KVT_ERR_NO_SPACE);
  EXPECT_KVT(kvt_block_alloc(out.data(), 5, m.get(), KVT_TIER_G2), KVT_ERR_NO_SPACE);
  EXPECT_TRUE(Snapshot(m.get()) == before);
  for (kvt_block b : out) EXPECT_EQ(b, 0u);  // out-parameters untouched
  // What is free is still allocatable in full.
  auto rest = alloc(m.get(), 3);
  EXPECT_EQ(rest.size(), 3u);
  EXPECT_KVT(kvt_manager_check(m.get()), KVT_OK);
}

TEST(Tiers, EachTierHasItsOwnRegistry) {
  auto m = make(small_config(4, 4, 4));
  kvt_block g1 = store(m.get(), {5}, KVT_TIER_G1)[0];
  kvt_block g3 = store(m.get(), {5}, KVT_TIER_G3)[0];
  EXPECT_NE(g1, g3);  // no dedup across tiers
  kvt_block out;
  size_t n;
  const uint64_t h = 5;
  ASSERT_KVT_OK(kvt_tier_match_prefix(&n, &out, m.get(), KVT_TIER_G2, &h, 1));
  EXPECT_EQ(n, 0u);
  ASSERT_KVT_OK(kvt_tier_match_prefix(&n, &out, m.get(), KVT_TIER_G3, &h, 1));
  EXPECT_EQ(n, 1u);
  EXPECT_EQ(out, g3);
  EXPECT_EQ(info(m.get(), g3).tier, uint32_t(KVT_TIER_G3));
  // A release may mix tiers.
  kvt_block both[3] = {g1, g3, out};
  ASSERT_KVT_OK(kvt_block_release(m.get(), both, 3));
  EXPECT_EQ(stats(m.get(), KVT_TIER_G1).inactive, 1u);
  EXPECT_EQ(stats(m.get(), KVT_TIER_G3).inactive, 1u);
}

TEST(Registry, RegisterHashesChainsParentsAndDedups) {
  auto m = make(small_config(8, 0));
  kvt_block first = store(m.get(), {2}, KVT_TIER_G1)[0];  // hash 2 exists already
  auto b = alloc(m.get(), 3);
  const uint64_t h[3] = {1, 2, 3};
  drain(m.get());
  kvt_block out[3];
  ASSERT_KVT_OK(kvt_block_register_hashes(out, m.get(), b.data(), h, 3, 77));
  EXPECT_EQ(out[0], b[0]);
  EXPECT_EQ(out[1], first);  // deduplicated, b[1] freed
  EXPECT_EQ(out[2], b[2]);
  EXPECT_EQ(info(m.get(), out[0]).parent_hash, 77u);
  EXPECT_EQ(info(m.get(), out[2]).parent_hash, 2u);
  auto ev = drain(m.get());
  ASSERT_EQ(ev.size(), 2u);  // the dedup stored nothing
  EXPECT_EQ(ev[0].hash, 1u);
  EXPECT_EQ(ev[0].parent_hash, 77u);
  EXPECT_EQ(ev[1].hash, 3u);
  EXPECT_EQ(ev[1].parent_hash, 2u);
  EXPECT_EQ(stats(m.get(), KVT_TIER_G1).free, 5u);  // 8 - 1 - 3 + the deduplicated one
  // In place: out may be the input array.
  auto c = alloc(m.get(), 2);
  const uint64_t h2[2] = {10, 11};
  ASSERT_KVT_OK(kvt_block_register_hashes(c.data(), m.get(), c.data(), h2, 2, 0));
  EXPECT_EQ(info(m.get(), c[1]).seq_hash, 11u);
  EXPECT_KVT(kvt_manager_check(m.get()), KVT_OK);
}

TEST(Registry, RegisterHashesIsAllOrNothing) {
  auto m = make(small_config(8, 4));
  auto b = alloc(m.get(), 3);
  kvt_block g2 = alloc(m.get(), 1, KVT_TIER_G2)[0];
  kvt_block registered = store(m.get(), {50})[0];
  const uint64_t h[3] = {1, 2, 3};
  kvt_block out[3] = {0, 0, 0};
  Snapshot before(m.get());
  kvt_block dup[3] = {b[0], b[1], b[0]};
  EXPECT_KVT(kvt_block_register_hashes(out, m.get(), dup, h, 3, 0), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kvt_last_error()).find("twice"), std::string::npos);
  kvt_block mixed[3] = {b[0], b[1], g2};
  EXPECT_KVT(kvt_block_register_hashes(out, m.get(), mixed, h, 3, 0), KVT_ERR_INVALID_ARGUMENT);
  kvt_block bad_state[3] = {b[0], registered, b[2]};
  EXPECT_KVT(kvt_block_register_hashes(out, m.get(), bad_state, h, 3, 0), KVT_ERR_STATE);
  kvt_block stale[3] = {b[0], b[1], b[2] ^ (uint64_t{1} << 50)};
  EXPECT_KVT(kvt_block_register_hashes(out, m.get(), stale, h, 3, 0), KVT_ERR_INVALID_HANDLE);
  EXPECT_KVT(kvt_block_register_hashes(out, m.get(), b.data(), nullptr, 3, 0),
             KVT_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(Snapshot(m.get()) == before);
  for (kvt_block x : b) {
    EXPECT_EQ(state_of(m.get(), x), uint32_t(KVT_BLOCK_EMPTY));
    EXPECT_EQ(info(m.get(), x).refs, 1u);
  }
  EXPECT_EQ(out[0], 0u);
  EXPECT_KVT(kvt_manager_check(m.get()), KVT_OK);
}

// Found by fuzz_api: with out one element past blocks, writing out[0] (a dedup's existing
// block) used to replace blocks[1] before it was read, so the existing block was registered
// again under another hash and the registry broke.
TEST(Registry, RegisterHashesWithOutShiftedOverBlocks) {
  auto m = make(small_config(8, 0));
  kvt_block existing = store(m.get(), {100})[0];
  auto b = alloc(m.get(), 3);
  kvt_block v[4] = {b[0], b[1], b[2], 0};
  const uint64_t h[3] = {100, 101, 102};
  ASSERT_KVT_OK(kvt_block_register_hashes(v + 1, m.get(), v, h, 3, 0));
  EXPECT_EQ(v[1], existing);  // dedup
  EXPECT_EQ(v[2], b[1]);
  EXPECT_EQ(v[3], b[2]);
  EXPECT_KVT(kvt_manager_check(m.get()), KVT_OK);
  size_t n = 0;
  kvt_block got[3];
  ASSERT_KVT_OK(kvt_tier_match_prefix(&n, got, m.get(), KVT_TIER_G1, h, 3));
  EXPECT_EQ(n, 3u);
  EXPECT_EQ(info(m.get(), b[2]).parent_hash, 101u);
  ASSERT_KVT_OK(kvt_block_release(m.get(), got, 3));
  ASSERT_KVT_OK(kvt_block_release(m.get(), v + 1, 3));
  ASSERT_KVT_OK(kvt_block_release(m.get(), &existing, 1));
  EXPECT_KVT(kvt_manager_check(m.get()), KVT_OK);
}
