// References counted by holder, tested on the library's own Tier compiled into this binary:
// what the pipeline takes is counted apart from what the host holds, so a reference the
// pipeline took for a host that can never release it shows up in kvt_manager_check (which
// holds the pipeline's count to what it expects) instead of pinning a block silently.
#include <gtest/gtest.h>

#include <mutex>

#include "block/tier.hpp"
#include "common/error.hpp"
#include "event/event_queue.hpp"

namespace kvt {
namespace {

struct XferAccounting : ::testing::Test {
  EventQueue events{64};
  Tier g1{KVT_TIER_G1, 7, 8, 4};
  XferAccounting() { g1.set_events(&events); }

  kvt_block alloc() {
    kvt_block b = 0;
    EXPECT_EQ(g1.alloc(&b, 1), KVT_OK) << last_error();
    return b;
  }
  void host_release(kvt_block b) {
    std::lock_guard lock(g1.lock());
    ASSERT_EQ(g1.take_ref_locked(b), KVT_OK) << last_error();
    g1.settle_locked(b);
  }
  kvt_tier_stats stats() {
    kvt_tier_stats s{};
    g1.stats(&s);
    return s;
  }
};

// The onboard of hash 1 into D, while G1 holds hash 1 in A: with the pin for the host, A is
// held by the pipeline until handed over; without it, D stays the caller's Empty block.
TEST_F(XferAccounting, APinForAHostThatLeftStaysCountedAsThePipelines) {
  kvt_block a = 0, d = alloc();
  ASSERT_EQ(g1.register_hash(&a, alloc(), 1, 0), KVT_OK);
  ASSERT_EQ(g1.pin_empty(d), KVT_OK);
  EXPECT_EQ(g1.refs_held(Holder::Pipeline), 1u);
  kvt_block out = 0;
  g1.commit_onboarded(&out, d, 1, 0, /*pin_existing=*/true);
  EXPECT_EQ(out, a);
  EXPECT_EQ(g1.refs_held(Holder::Pipeline), 1u) << "the pin moved to A";
  // The host lets go of everything it knows of: A and D.
  host_release(a);
  host_release(d);
  EXPECT_EQ(g1.check(), KVT_OK) << last_error();
  // A stays active, and the counts say whose reference holds it.
  EXPECT_EQ(stats().active, 1u);
  EXPECT_EQ(g1.refs_held(Holder::Host), 0u);
  EXPECT_EQ(g1.refs_held(Holder::Pipeline), 1u);
}

TEST_F(XferAccounting, WithoutThePinTheCallersBlockStaysEmptyAndNothingIsHeld) {
  kvt_block a = 0, d = alloc();
  ASSERT_EQ(g1.register_hash(&a, alloc(), 1, 0), KVT_OK);
  ASSERT_EQ(g1.pin_empty(d), KVT_OK);
  kvt_block out = 1;
  g1.commit_onboarded(&out, d, 1, 0, /*pin_existing=*/false);
  EXPECT_EQ(out, 0u);
  kvt_block_info bi{};
  ASSERT_EQ(g1.info(&bi, d), KVT_OK);
  EXPECT_EQ(bi.state, uint32_t(KVT_BLOCK_EMPTY));
  EXPECT_EQ(bi.refs, 1u);
  EXPECT_EQ(g1.refs_held(Holder::Pipeline), 0u);
  host_release(a);
  host_release(d);
  EXPECT_EQ(g1.check(), KVT_OK) << last_error();
  EXPECT_EQ(stats().active, 0u);
}

TEST_F(XferAccounting, HandOverMovesThePinToTheHostAndFreesTheCallersBlock) {
  kvt_block a = 0, d = alloc();
  ASSERT_EQ(g1.register_hash(&a, alloc(), 1, 0), KVT_OK);
  ASSERT_EQ(g1.pin_empty(d), KVT_OK);
  kvt_block out = 0;
  g1.commit_onboarded(&out, d, 1, 0, true);
  g1.hand_over(d);
  EXPECT_EQ(g1.refs_held(Holder::Pipeline), 0u);
  EXPECT_EQ(g1.refs_held(Holder::Host), 2u);  // A, twice
  kvt_block_info bi{};
  EXPECT_EQ(g1.info(&bi, d), KVT_ERR_INVALID_HANDLE) << "the caller's block went";
  host_release(a);
  host_release(out);
  EXPECT_EQ(g1.check(), KVT_OK) << last_error();
  EXPECT_EQ(stats().active, 0u);
}

TEST_F(XferAccounting, RegisteringABlockAnOnboardWritesIsRefused) {
  kvt_block d = alloc();
  ASSERT_EQ(g1.pin_empty(d), KVT_OK);
  kvt_block out = 0;
  EXPECT_EQ(g1.register_hash(&out, d, 5, 0), KVT_ERR_STATE);
  EXPECT_NE(std::string(last_error()).find("onboard in flight"), std::string::npos);
  g1.commit_onboarded(&out, d, 5, 0, true);
  EXPECT_EQ(out, d);
  EXPECT_EQ(g1.check(), KVT_OK) << last_error();
  host_release(d);
}

}  // namespace
}  // namespace kvt
