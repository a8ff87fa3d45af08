// A slot's generations, tested on the library's own Tier compiled into this binary: slots
// start near the last generation (the Tier's first_gen, 0 in the library), so that the
// retirement that follows 2^28 reuses happens within a few calls.
#include <gtest/gtest.h>

#include <vector>

#include "block/handle.hpp"
#include "block/tier.hpp"
#include "common/error.hpp"
#include "event/event_queue.hpp"

namespace kvt {
namespace {

constexpr uint32_t kLast = handle::kLastGen;

TEST(AbiGenerations, HandleFieldsRoundTripAtTheirBounds) {
  const uint64_t h = handle::make(handle::kTags - 1, KVT_TIER_G3, handle::kSlotMask, kLast);
  EXPECT_EQ(handle::tag(h), handle::kTags - 1);
  EXPECT_EQ(handle::tier(h), unsigned(KVT_TIER_G3));
  EXPECT_EQ(handle::slot(h), KVT_MAX_TIER_BLOCKS);
  EXPECT_EQ(handle::gen(h), kLast);
  EXPECT_EQ(kLast, (1u << 28) - 1);
  // Tag 0, slot 0, generation 0 of G1 is still not the invalid handle 0.
  EXPECT_NE(handle::make(0, KVT_TIER_G1, 0, 0), 0u);
}

struct AbiTierGenerations : ::testing::Test {
  EventQueue events{64};
  std::vector<kvt_event> polled;

  std::unique_ptr<Tier> tier(uint64_t capacity, uint32_t first_gen) {
    auto t = std::make_unique<Tier>(KVT_TIER_G2, 5, capacity, 4, first_gen);
    t->set_events(&events);
    return t;
  }
  static kvt_block alloc(Tier &t) {
    kvt_block b = 0;
    EXPECT_EQ(t.alloc(&b, 1), KVT_OK) << last_error();
    return b;
  }
  // Manager::release for one block of one tier.
  static kvt_status release(Tier &t, kvt_block b) {
    std::lock_guard lock(t.lock());
    if (kvt_status s = t.take_ref_locked(b); s != KVT_OK) return s;
    t.settle_locked(b);
    return KVT_OK;
  }
  static kvt_tier_stats stats(Tier &t) {
    kvt_tier_stats s{};
    t.stats(&s);
    return s;
  }
  std::vector<kvt_event> poll() {
    std::vector<kvt_event> out(64);
    out.resize(events.poll(out.data(), out.size()));
    return out;
  }
};

TEST_F(AbiTierGenerations, AMutableBlockAtTheLastGenerationRetiresItsSlot) {
  auto t = tier(2, kLast - 1);
  kvt_block a = alloc(*t);
  EXPECT_EQ(handle::gen(a), kLast - 1);
  ASSERT_EQ(release(*t, a), KVT_OK);
  kvt_block b = alloc(*t);  // the same slot, at its last generation
  EXPECT_EQ(handle::slot(b), handle::slot(a));
  EXPECT_EQ(handle::gen(b), kLast);
  ASSERT_EQ(release(*t, b), KVT_OK);
  kvt_tier_stats s = stats(*t);
  EXPECT_EQ(s.retired, 1u);
  EXPECT_EQ(s.free, 1u);
  EXPECT_EQ(s.active + s.inactive, 0u);
  EXPECT_EQ(t->check(), KVT_OK) << last_error();
  // Neither handle of the retired slot comes back, and the slot is never handed out again.
  EXPECT_EQ(release(*t, a), KVT_ERR_INVALID_HANDLE);
  EXPECT_EQ(release(*t, b), KVT_ERR_INVALID_HANDLE);
  kvt_block c = alloc(*t);
  EXPECT_NE(handle::slot(c), handle::slot(b));
  kvt_block d = 0;
  EXPECT_EQ(t->alloc(&d, 1), KVT_ERR_NO_SPACE);
  EXPECT_EQ(release(*t, c), KVT_OK);
  EXPECT_EQ(t->check(), KVT_OK) << last_error();
}

// A registered block at the last generation cannot become inactive (its eviction would need
// a new generation): when its last reference goes, it leaves the registry with BLOCK_REMOVED.
TEST_F(AbiTierGenerations, ARegisteredBlockAtTheLastGenerationLeavesWhenReleased) {
  auto t = tier(2, kLast);
  kvt_block b = alloc(*t), r = 0;
  ASSERT_EQ(t->register_hash(&r, b, 42, 0), KVT_OK);
  kvt_block again = 0;
  ASSERT_EQ(t->retain(r), KVT_OK);
  ASSERT_EQ(release(*t, r), KVT_OK);  // one reference left: still registered
  EXPECT_TRUE(t->contains(42));
  ASSERT_EQ(release(*t, r), KVT_OK);
  EXPECT_FALSE(t->contains(42));
  size_t n = 9;
  const uint64_t hash = 42;
  EXPECT_EQ(t->match(&n, &again, &hash, 1), KVT_OK);
  EXPECT_EQ(n, 0u);
  std::vector<kvt_event> ev = poll();
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(ev[0].type, uint32_t(KVT_EVENT_BLOCK_STORED));
  EXPECT_EQ(ev[1].type, uint32_t(KVT_EVENT_BLOCK_REMOVED));
  EXPECT_EQ(ev[1].hash, 42u);
  kvt_tier_stats s = stats(*t);
  EXPECT_EQ(s.retired, 1u);
  EXPECT_EQ(s.registered, 0u);
  EXPECT_EQ(t->check(), KVT_OK) << last_error();
}

// An inactive block one generation before the last is evicted into its last generation, and
// that life ends in retirement.
TEST_F(AbiTierGenerations, EvictionIntoTheLastGenerationThenRetirement) {
  auto t = tier(1, kLast - 1);
  kvt_block b = alloc(*t), r = 0;
  ASSERT_EQ(t->register_hash(&r, b, 7, 0), KVT_OK);
  ASSERT_EQ(release(*t, r), KVT_OK);  // inactive
  EXPECT_EQ(stats(*t).inactive, 1u);
  kvt_block e = alloc(*t);  // evicts it
  EXPECT_EQ(handle::gen(e), kLast);
  EXPECT_EQ(stats(*t).evictions, 1u);
  EXPECT_EQ(release(*t, r), KVT_ERR_INVALID_HANDLE);
  ASSERT_EQ(release(*t, e), KVT_OK);
  EXPECT_EQ(stats(*t).retired, 1u);
  kvt_block none = 0;
  EXPECT_EQ(t->alloc(&none, 1), KVT_ERR_NO_SPACE);
  EXPECT_EQ(t->check(), KVT_OK) << last_error();
}

// A registration that deduplicates frees the caller's block: at the last generation, that
// retires its slot instead.
TEST_F(AbiTierGenerations, ADeduplicatedBlockAtTheLastGenerationRetires) {
  auto t = tier(2, kLast);
  kvt_block a = alloc(*t), b = alloc(*t), ra = 0, rb = 0;
  ASSERT_EQ(t->register_hash(&ra, a, 9, 0), KVT_OK);
  ASSERT_EQ(t->register_hash(&rb, b, 9, 0), KVT_OK);
  EXPECT_EQ(rb, ra);
  kvt_tier_stats s = stats(*t);
  EXPECT_EQ(s.retired, 1u);
  EXPECT_EQ(s.active, 1u);
  EXPECT_EQ(t->check(), KVT_OK) << last_error();
  EXPECT_EQ(release(*t, b), KVT_ERR_INVALID_HANDLE);
  ASSERT_EQ(release(*t, ra), KVT_OK);
  ASSERT_EQ(release(*t, ra), KVT_OK);
  EXPECT_EQ(stats(*t).retired, 2u);
  EXPECT_EQ(t->check(), KVT_OK) << last_error();
}

}  // namespace
}  // namespace kvt
