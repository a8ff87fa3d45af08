// Onboards that end badly or strangely: released in flight into G1 blocks whose hashes G1
// already holds (every reference must come back), a destination registered while it is
// written, and a G3 copy that fails its checksum (it leaves the registry).
#include <fcntl.h>
#include <unistd.h>

#include "test_xfer_support.hpp"

using namespace kvt_xfer_test;

namespace {

struct Onboard {
  std::vector<uint64_t> h;
  std::vector<kvt_block> g1, g2, dst;  // held by the host: originals, G2 copies, destinations
};

// G1 holds hashes h (the host keeps its references), G2 their copies, and n Empty G1 blocks
// wait as destinations.
Onboard prepare(kvt_manager *m, size_t n) {
  Onboard o;
  for (size_t i = 0; i < n; ++i) o.h.push_back(500 + i);
  o.g1 = filled(m, o.h, 9);
  kvt_xfer *x = nullptr;
  EXPECT_KVT(kvt_xfer_offload(&x, m, o.g1.data(), n, KVT_TIER_G2, nullptr, 0), KVT_OK);
  EXPECT_KVT(finish(x), KVT_OK);
  kvt_xfer_release(x);
  EXPECT_EQ(matched(m, KVT_TIER_G2, o.h, &o.g2), n);
  o.dst = alloc(m, n);
  return o;
}

// Onboards G2 -> G1 that have ended, released or not.
uint64_t onboards_ended(kvt_manager *m) {
  kvt_transfer_stats s{};
  s.struct_size = sizeof s;
  EXPECT_KVT(kvt_transfer_stats_get(&s, m, KVT_TIER_G2, KVT_TIER_G1), KVT_OK);
  return s.completed + s.failed + s.cancelled;
}

kvt_manager_config onboard_config(const TempDir &dir, size_t n) {
  kvt_manager_config c = xfer_config(dir, 2 * n, n, 0);
  c.chunk_bytes = 32768;  // 128 KiB blocks
  c.max_batch_size = 8;   // and many batches: a long time in flight
  return c;
}

}  // namespace

// Released at any point (before commitment, in flight, or after the end unread), the
// caller's destinations stay its own, Empty, and nothing else stays pinned.
TEST(XferOnboard, ReleasedOnboardIntoHashesG1HoldsPinsNothing) {
  TempDir dir;
  const size_t n = 192;
  auto m = make(onboard_config(dir, n));
  int in_flight = 0;
  uint64_t ended = 0;
  for (int round = 0; round < 6; ++round) {
    Onboard o = prepare(m.get(), n);
    kvt_xfer *x = nullptr;
    ASSERT_KVT_OK(kvt_xfer_onboard(&x, m.get(), o.g2.data(), o.dst.data(), n, nullptr, 0));
    uint32_t st = 0;
    if (round % 3 == 0) {  // in flight
      while ((st = state_of_xfer(x)) < KVT_XFER_INFLIGHT) std::this_thread::yield();
      in_flight += st == KVT_XFER_INFLIGHT;
    } else if (round % 3 == 1) {  // after the end, its final handles never read
      ASSERT_KVT_OK(finish(x));
      EXPECT_KVT(kvt_manager_check(m.get()), KVT_OK);
    }  // else at once, most likely before commitment
    kvt_xfer_release(x);
    // A copy in flight goes on after the release; its pins go when it ends.
    for (int i = 0; i < 10000 && onboards_ended(m.get()) == ended; ++i)
      std::this_thread::sleep_for(1ms);
    ended = onboards_ended(m.get());
    for (kvt_block b : o.dst) {
      kvt_block_info bi = info(m.get(), b);  // still valid
      EXPECT_EQ(bi.state, uint32_t(KVT_BLOCK_EMPTY));
      EXPECT_EQ(bi.refs, 1u);
    }
    for (kvt_block b : o.g1) EXPECT_EQ(info(m.get(), b).refs, 1u) << "G1's block stays pinned";
    EXPECT_KVT(kvt_manager_check(m.get()), KVT_OK);
    ASSERT_KVT_OK(kvt_block_release(m.get(), o.dst.data(), n));
    ASSERT_KVT_OK(kvt_block_release(m.get(), o.g2.data(), n));
    ASSERT_KVT_OK(kvt_block_release(m.get(), o.g1.data(), n));
    expect_all_returned(m.get());
    // Next round from scratch: evict what the tiers keep.
    for (kvt_tier t : {KVT_TIER_G1, KVT_TIER_G2}) {
      auto all = alloc(m.get(), stats(m.get(), t).capacity, t);
      ASSERT_KVT_OK(kvt_block_release(m.get(), all.data(), all.size()));
    }
  }
  // Valgrind runs one thread at a time, so a copy is rarely seen in flight there.
  if (!RUNNING_ON_VALGRIND) {
    EXPECT_GT(in_flight, 0) << "no release landed in flight";
  }
}

// Two onboards that name the same destination never both write it: held on one fence, they
// reach the batcher together and commit in one batch; the second to commit drops that pair
// (final handle 0). Once the block is registered, a new onboard naming it is refused.
TEST(XferOnboard, OneDestinationInTwoOnboardsIsWrittenOnce) {
  TempDir dir;
  kvt_manager_config c = onboard_config(dir, 4);
  c.min_batch_size = 2;  // both in one batch
  c.flush_interval_us = 60'000'000;
  auto m = make(c);
  Onboard o = prepare(m.get(), 2);  // two blocks: the offload in prepare() flushes at once
  ASSERT_KVT_OK(kvt_block_release(m.get(), o.g1.data(), 2));  // G1 no longer holds the hashes
  kvt_tier_stats g1s = stats(m.get(), KVT_TIER_G1);
  auto all = alloc(m.get(), g1s.free + g1s.inactive);
  ASSERT_KVT_OK(kvt_block_release(m.get(), all.data(), all.size()));
  kvt_fence *f = nullptr;
  ASSERT_KVT_OK(kvt_fence_create(&f, m.get()));
  kvt_xfer *x[2] = {}, *third = nullptr;
  for (int i = 0; i < 2; ++i)
    ASSERT_KVT_OK(kvt_xfer_onboard(&x[i], m.get(), o.g2.data(), o.dst.data(), 1, f, i));
  ASSERT_KVT_OK(kvt_fence_signal(f));
  uint64_t counts[2] = {9, 9};
  kvt_block got[2] = {1, 1};
  for (int i = 0; i < 2; ++i) {
    ASSERT_KVT_OK(finish(x[i]));
    ASSERT_KVT_OK(kvt_xfer_status(nullptr, nullptr, &counts[i], x[i]));
    ASSERT_KVT_OK(kvt_xfer_blocks(&got[i], 1, x[i]));
  }
  EXPECT_EQ(counts[0] + counts[1], 1u) << "one block, written by both onboards";
  EXPECT_EQ(got[0] + got[1], o.dst[0]) << "one final handle is the block, the other 0";
  EXPECT_KVT(kvt_manager_check(m.get()), KVT_OK);
  EXPECT_KVT(kvt_xfer_onboard(&third, m.get(), o.g2.data(), o.dst.data(), 1, nullptr, 3),
             KVT_ERR_STATE);
  for (kvt_xfer *t : x) kvt_xfer_release(t);
  kvt_fence_destroy(f);
  ASSERT_KVT_OK(kvt_block_release(m.get(), o.dst.data(), 2));
  ASSERT_KVT_OK(kvt_block_release(m.get(), o.g2.data(), 2));
  expect_all_returned(m.get());
}

// Read before the release, the final handles are G1's blocks, and the caller's went.
TEST(XferOnboard, ReadFinalBlocksAreTheHeldOnesAndEveryReferenceReturns) {
  TempDir dir;
  const size_t n = 40;
  auto m = make(onboard_config(dir, n));
  Onboard o = prepare(m.get(), n);
  kvt_xfer *x = nullptr;
  ASSERT_KVT_OK(kvt_xfer_onboard(&x, m.get(), o.g2.data(), o.dst.data(), n, nullptr, 0));
  ASSERT_KVT_OK(finish(x));
  uint64_t count = 0;
  ASSERT_KVT_OK(kvt_xfer_status(nullptr, nullptr, &count, x));
  EXPECT_EQ(count, n);
  std::vector<kvt_block> fin(n);
  ASSERT_KVT_OK(kvt_xfer_blocks(fin.data(), n, x));
  EXPECT_EQ(fin, o.g1);
  ASSERT_KVT_OK(kvt_xfer_blocks(fin.data(), n, x));  // again: the same, nothing moves twice
  EXPECT_EQ(fin, o.g1);
  kvt_block_info bi{};
  bi.struct_size = sizeof bi;
  EXPECT_KVT(kvt_block_info_get(&bi, m.get(), o.dst[0]), KVT_ERR_INVALID_HANDLE);
  kvt_xfer_release(x);
  EXPECT_KVT(kvt_manager_check(m.get()), KVT_OK);
  ASSERT_KVT_OK(kvt_block_release(m.get(), fin.data(), n));
  ASSERT_KVT_OK(kvt_block_release(m.get(), o.g2.data(), n));
  ASSERT_KVT_OK(kvt_block_release(m.get(), o.g1.data(), n));
  expect_all_returned(m.get());
}

TEST(XferOnboard, RegisteringADestinationInFlightIsRefused) {
  if (RUNNING_ON_VALGRIND)  // XferAccounting.RegisteringABlockAnOnboardWritesIsRefused holds
    GTEST_SKIP() << "valgrind runs one thread at a time: the copy is never seen in flight";
  TempDir dir;
  const size_t n = 192;
  auto m = make(onboard_config(dir, n));
  int refused = 0;
  for (int round = 0; round < 5 && refused == 0; ++round) {
    Onboard o = prepare(m.get(), n);
    // Fresh hashes, so that the copies register.
    ASSERT_KVT_OK(kvt_block_release(m.get(), o.g1.data(), n));
    kvt_tier_stats g1s = stats(m.get(), KVT_TIER_G1);
    auto all = alloc(m.get(), g1s.free + g1s.inactive);
    ASSERT_KVT_OK(kvt_block_release(m.get(), all.data(), all.size()));
    kvt_xfer *x = nullptr;
    ASSERT_KVT_OK(kvt_xfer_onboard(&x, m.get(), o.g2.data(), o.dst.data(), n, nullptr, 0));
    while (state_of_xfer(x) < KVT_XFER_INFLIGHT) std::this_thread::yield();
    kvt_block out = 0;
    kvt_status s = kvt_block_register_hash(&out, m.get(), o.dst[0], 0xdead, 0);
    uint64_t h = 0xbeef;
    kvt_status sb = kvt_block_register_hashes(&out, m.get(), &o.dst[1], &h, 1, 0);
    if (state_of_xfer(x) == KVT_XFER_INFLIGHT) {  // still written while both calls ran
      ++refused;
      EXPECT_EQ(s, KVT_ERR_STATE);
      EXPECT_NE(std::string(kvt_last_error()).find("onboard"), std::string::npos);
      EXPECT_NE(sb, KVT_OK);
    }
    ASSERT_KVT_OK(finish(x));
    EXPECT_KVT(kvt_manager_check(m.get()), KVT_OK);
    std::vector<kvt_block> fin(n);
    ASSERT_KVT_OK(kvt_xfer_blocks(fin.data(), n, x));
    kvt_xfer_release(x);
    ASSERT_KVT_OK(kvt_block_release(m.get(), fin.data(), n));
    ASSERT_KVT_OK(kvt_block_release(m.get(), o.g2.data(), n));
    expect_all_returned(m.get());
    for (kvt_tier t : {KVT_TIER_G1, KVT_TIER_G2}) {
      auto every = alloc(m.get(), stats(m.get(), t).capacity, t);
      ASSERT_KVT_OK(kvt_block_release(m.get(), every.data(), every.size()));
    }
  }
  EXPECT_GT(refused, 0) << "no registration landed while the onboard was in flight";
}

TEST(XferOnboard, CorruptG3CopyLeavesTheRegistryAndIsRecomputedOnce) {
  TempDir dir;
  kvt_manager_config c = xfer_config(dir, 8, 8, 16);
  auto m = make(c);
  std::vector<uint64_t> h = {11, 12};
  auto g1 = filled(m.get(), h, 4);
  kvt_xfer *x = nullptr;
  ASSERT_KVT_OK(kvt_xfer_offload(&x, m.get(), g1.data(), 2, KVT_TIER_G3, nullptr, 0));
  ASSERT_KVT_OK(finish(x));
  kvt_xfer_release(x);
  ASSERT_KVT_OK(kvt_block_release(m.get(), g1.data(), 2));
  auto all = alloc(m.get(), 8);  // evicts both from G1
  ASSERT_KVT_OK(kvt_block_release(m.get(), all.data(), all.size()));
  // Flip bytes inside the second slot's data, on disk.
  std::string file = dir.g3_file();
  int fd = open(file.c_str(), O_RDWR);
  ASSERT_GE(fd, 0) << file;
  const off_t slot_bytes = 4096 + 4096;  // 4 KiB of data + 4 KiB header
  unsigned char b[16];
  ASSERT_EQ(pread(fd, b, sizeof b, slot_bytes + 100), ssize_t(sizeof b));
  for (auto &v : b) v ^= 0x5a;
  ASSERT_EQ(pwrite(fd, b, sizeof b, slot_bytes + 100), ssize_t(sizeof b));
  close(fd);

  std::vector<kvt_block> src;
  ASSERT_EQ(matched(m.get(), KVT_TIER_G3, h, &src), 2u);
  drain(m.get());
  auto dst = alloc(m.get(), 2);
  ASSERT_KVT_OK(kvt_xfer_onboard(&x, m.get(), src.data(), dst.data(), 2, nullptr, 0));
  EXPECT_KVT(finish(x), KVT_ERR_CORRUPT);
  kvt_xfer_release(x);
  size_t removed = 0;
  for (auto &e : drain(m.get()))
    if (e.type == KVT_EVENT_BLOCK_REMOVED) {
      ++removed;
      EXPECT_EQ(e.tier, uint32_t(KVT_TIER_G3));
      EXPECT_EQ(e.hash, 12u);
    }
  EXPECT_EQ(removed, 1u);
  EXPECT_EQ(matched(m.get(), KVT_TIER_G3, h), 1u) << "the corrupt copy is still matched";
  kvt_xfer *y = nullptr;
  EXPECT_KVT(kvt_xfer_onboard(&y, m.get(), &src[1], &dst[1], 1, nullptr, 0), KVT_ERR_STATE);
  EXPECT_KVT(kvt_manager_check(m.get()), KVT_OK);
  ASSERT_KVT_OK(kvt_block_release(m.get(), src.data(), 2));  // frees the removed one
  ASSERT_KVT_OK(kvt_block_release(m.get(), dst.data(), 2));
  expect_all_returned(m.get());

  // The engine recomputes block 12 once; it is stored and onboarded intact.
  auto again = filled(m.get(), {12}, 4);
  ASSERT_KVT_OK(kvt_xfer_offload(&x, m.get(), again.data(), 1, KVT_TIER_G3, nullptr, 0));
  ASSERT_KVT_OK(finish(x));
  kvt_xfer_release(x);
  ASSERT_KVT_OK(kvt_block_release(m.get(), again.data(), 1));
  all = alloc(m.get(), 8);
  ASSERT_KVT_OK(kvt_block_release(m.get(), all.data(), all.size()));
  std::vector<kvt_block> src2;
  ASSERT_EQ(matched(m.get(), KVT_TIER_G3, {12}, &src2), 1u);
  dst = alloc(m.get(), 1);
  ASSERT_KVT_OK(kvt_xfer_onboard(&x, m.get(), src2.data(), dst.data(), 1, nullptr, 0));
  ASSERT_KVT_OK(finish(x));
  kvt_block fin = 0;
  ASSERT_KVT_OK(kvt_xfer_blocks(&fin, 1, x));
  kvt_xfer_release(x);
  ASSERT_KVT_OK(kvt_block_release(m.get(), &fin, 1));
  ASSERT_KVT_OK(kvt_block_release(m.get(), src2.data(), 1));
  expect_all_returned(m.get());
}
