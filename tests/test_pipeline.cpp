// The offload/onboard pipeline: real bytes through G1 -> G2 -> G3 and back, cancellation at
// every stage, weak references, corruption, injected I/O failure, presence and frequency.
#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>

#include "support.hpp"

using namespace kvt_test;

namespace {


kvt_manager_config pipe_config(const TempDir &dir, uint64_t g1 = 8, uint64_t g2 = 8,
                               uint64_t g3 = 16) {
  kvt_manager_config c = small_config(g1, g2, g3);
  c.chunk_bytes = 1024;  // 2 layers x 2 x 1 KiB = 4 KiB blocks
  c.g3_path = dir.path.c_str();
  c.flush_interval_us = 1000;
  c.min_batch_size = 1;
  return c;
}

std::vector<unsigned char> bytes_of(kvt_manager *m, kvt_block b) {
  void *p = nullptr;
  size_t len = 0;
  EXPECT_EQ(kvt_block_data(&p, &len, m, b), KVT_OK) << kvt_last_error();
  auto *c = static_cast<unsigned char *>(p);
  return std::vector<unsigned char>(c, c + len);
}

// Fills G1 blocks with random bytes and registers them as one chain; returns the handles.
std::vector<kvt_block> computed(kvt_manager *m, const std::vector<uint64_t> &hashes,
                                std::vector<std::vector<unsigned char>> *data, uint32_t seed) {
  auto b = alloc(m, hashes.size());
  std::mt19937_64 rng(seed);
  for (kvt_block x : b) {
    void *p;
    size_t len;
    EXPECT_EQ(kvt_block_data(&p, &len, m, x), KVT_OK);
    for (size_t i = 0; i + 8 <= len; i += 8) {
      uint64_t v = rng();
      std::memcpy(static_cast<unsigned char *>(p) + i, &v, 8);
    }
    if (data) data->push_back(bytes_of(m, x));
  }
  std::vector<kvt_block> out(b.size());
  EXPECT_EQ(kvt_block_register_hashes(out.data(), m, b.data(), hashes.data(), b.size(), 0),
            KVT_OK);
  return out;
}

// Waits for a transfer and returns its status; the XFER_DONE event stays queued.
kvt_status finish(kvt_xfer *x) { return kvt_xfer_wait(x, int64_t(10) * 1000 * 1000 * 1000); }

// XFER_DONE events among the drained events.
std::vector<kvt_event> xfer_events(const std::vector<kvt_event> &all) {
  std::vector<kvt_event> out;
  for (auto &e : all)
    if (e.type == KVT_EVENT_XFER_DONE) out.push_back(e);
  return out;
}

// Evicts everything inactive in a tier by allocating (and then freeing) its whole capacity.
void evict_all(kvt_manager *m, kvt_tier t) {
  kvt_tier_stats s = stats(m, t);
  auto b = alloc(m, s.free + s.inactive, t);
  ASSERT_KVT_OK(kvt_block_release(m, b.data(), b.size()));
  EXPECT_EQ(stats(m, t).registered, stats(m, t).active);
}

uint32_t state_of_xfer(kvt_xfer *x) {
  uint32_t st = 0;
  kvt_xfer_status(&st, nullptr, nullptr, x);
  return st;
}

}  // namespace

TEST(Pipeline, BytesSurviveG1ToG2ToG3AndBackToG1) {
  TempDir dir;
  for (uint32_t io : {uint32_t(KVT_IO_AUTO), uint32_t(KVT_IO_THREADS)}) {
    kvt_manager_config c = pipe_config(dir);
    c.g3_io = test_g3_io(io);
    auto m = make(c);
    std::vector<uint64_t> h = {101, 102, 103, 104};
    std::vector<std::vector<unsigned char>> want;
    auto g1 = computed(m.get(), h, &want, 1);
    std::vector<kvt_event> ev;  // XFER_DONE events, drained before each release withdraws them
    auto collect = [&] {
      auto e = xfer_events(drain(m.get()));
      ev.insert(ev.end(), e.begin(), e.end());
    };
    kvt_xfer *x = nullptr;
    ASSERT_KVT_OK(kvt_xfer_offload(&x, m.get(), g1.data(), 4, KVT_TIER_G2, nullptr, 7));
    ASSERT_KVT_OK(finish(x));
    uint64_t count = 0;
    ASSERT_KVT_OK(kvt_xfer_status(nullptr, nullptr, &count, x));
    EXPECT_EQ(count, 4u);
    collect();
    kvt_xfer_release(x);
    std::vector<kvt_block> g2;
    ASSERT_EQ(matched(m.get(), KVT_TIER_G2, h, &g2), 4u);
    for (size_t i = 0; i < 4; ++i) EXPECT_EQ(bytes_of(m.get(), g2[i]), want[i]);
    EXPECT_EQ(info(m.get(), g2[1]).parent_hash, 101u);
    ASSERT_KVT_OK(kvt_xfer_offload(&x, m.get(), g2.data(), 4, KVT_TIER_G3, nullptr, 8));
    ASSERT_KVT_OK(finish(x));
    collect();
    kvt_xfer_release(x);
    ASSERT_KVT_OK(kvt_block_release(m.get(), g2.data(), 4));
    ASSERT_KVT_OK(kvt_block_release(m.get(), g1.data(), 4));
    evict_all(m.get(), KVT_TIER_G1);
    evict_all(m.get(), KVT_TIER_G2);
    EXPECT_EQ(matched(m.get(), KVT_TIER_G1, h), 0u);
    EXPECT_EQ(matched(m.get(), KVT_TIER_G2, h), 0u);
    std::vector<kvt_block> g3;
    ASSERT_EQ(matched(m.get(), KVT_TIER_G3, h, &g3), 4u);
    auto dst = alloc(m.get(), 4);
    ASSERT_KVT_OK(kvt_xfer_onboard(&x, m.get(), g3.data(), dst.data(), 4, nullptr, 9));
    ASSERT_KVT_OK(finish(x));
    std::vector<kvt_block> fin(4);
    ASSERT_KVT_OK(kvt_xfer_blocks(fin.data(), 4, x));
    EXPECT_EQ(fin, dst);  // nothing else had registered these hashes in G1
    collect();
    kvt_xfer_release(x);
    for (size_t i = 0; i < 4; ++i) {
      EXPECT_EQ(bytes_of(m.get(), fin[i]), want[i]) << "block " << i;
      EXPECT_EQ(info(m.get(), fin[i]).seq_hash, h[i]);
      EXPECT_EQ(info(m.get(), fin[i]).state, uint32_t(KVT_BLOCK_REGISTERED));
    }
    EXPECT_EQ(matched(m.get(), KVT_TIER_G1, h), 4u);
    // The events: three XFER_DONE with their user_data, counts and destination tiers.
    ASSERT_EQ(ev.size(), 3u);
    EXPECT_EQ(ev[0].user_data, 7u);
    EXPECT_EQ(ev[0].tier, uint32_t(KVT_TIER_G2));
    EXPECT_EQ(ev[1].tier, uint32_t(KVT_TIER_G3));
    EXPECT_EQ(ev[2].tier, uint32_t(KVT_TIER_G1));
    for (auto &e : ev) EXPECT_EQ(e.count, 4u);
    ASSERT_KVT_OK(kvt_block_release(m.get(), fin.data(), 4));
    ASSERT_KVT_OK(kvt_block_release(m.get(), g3.data(), 4));
    EXPECT_KVT(kvt_manager_check(m.get()), KVT_OK);
  }
}

TEST(Pipeline, G1ToG3DirectlyAndG2ToG1) {
  TempDir dir;
  auto m = make(pipe_config(dir));
  std::vector<uint64_t> h = {5, 6};
  std::vector<std::vector<unsigned char>> want;
  auto g1 = computed(m.get(), h, &want, 2);
  kvt_xfer *a = nullptr, *b = nullptr;
  ASSERT_KVT_OK(kvt_xfer_offload(&a, m.get(), g1.data(), 2, KVT_TIER_G3, nullptr, 1));
  ASSERT_KVT_OK(kvt_xfer_offload(&b, m.get(), g1.data(), 2, KVT_TIER_G2, nullptr, 2));
  ASSERT_KVT_OK(finish(a));
  ASSERT_KVT_OK(finish(b));
  kvt_xfer_release(a);
  kvt_xfer_release(b);
  ASSERT_KVT_OK(kvt_block_release(m.get(), g1.data(), 2));
  evict_all(m.get(), KVT_TIER_G1);
  for (kvt_tier from : {KVT_TIER_G2, KVT_TIER_G3}) {
    std::vector<kvt_block> src;
    ASSERT_EQ(matched(m.get(), from, h, &src), 2u);
    auto dst = alloc(m.get(), 2);
    kvt_xfer *x = nullptr;
    ASSERT_KVT_OK(kvt_xfer_onboard(&x, m.get(), src.data(), dst.data(), 2, nullptr, 3));
    ASSERT_KVT_OK(finish(x));
    kvt_xfer_release(x);
    for (size_t i = 0; i < 2; ++i) EXPECT_EQ(bytes_of(m.get(), dst[i]), want[i]);
    ASSERT_KVT_OK(kvt_block_release(m.get(), dst.data(), 2));
    ASSERT_KVT_OK(kvt_block_release(m.get(), src.data(), 2));
    evict_all(m.get(), KVT_TIER_G1);
  }
  // Every direction used counted its one transfer, its blocks and some engine time.
  const uint64_t block_bytes = stats(m.get(), KVT_TIER_G1).block_bytes;
  for (auto [from, to] : {std::pair{KVT_TIER_G1, KVT_TIER_G3}, {KVT_TIER_G1, KVT_TIER_G2},
                          {KVT_TIER_G2, KVT_TIER_G1}, {KVT_TIER_G3, KVT_TIER_G1}}) {
    kvt_transfer_stats t{};
    t.struct_size = sizeof t;
    ASSERT_KVT_OK(kvt_transfer_stats_get(&t, m.get(), from, to));
    EXPECT_EQ(t.completed, 1u);
    EXPECT_EQ(t.cancelled + t.failed, 0u);
    EXPECT_EQ(t.blocks, 2u);
    EXPECT_EQ(t.bytes, 2 * block_bytes);
    EXPECT_GT(t.busy_ns, 0u);
  }
  kvt_transfer_stats t{};
  t.struct_size = sizeof t;
  ASSERT_KVT_OK(kvt_transfer_stats_get(&t, m.get(), KVT_TIER_G2, KVT_TIER_G3));
  EXPECT_EQ(t.completed + t.blocks + t.busy_ns, 0u);
  EXPECT_KVT(kvt_transfer_stats_get(&t, m.get(), KVT_TIER_G3, KVT_TIER_G2),
             KVT_ERR_INVALID_ARGUMENT);
  EXPECT_KVT(kvt_transfer_stats_get(&t, m.get(), KVT_TIER_G1, KVT_TIER_G1),
             KVT_ERR_INVALID_ARGUMENT);
  t.struct_size = 8;
  EXPECT_KVT(kvt_transfer_stats_get(&t, m.get(), KVT_TIER_G1, KVT_TIER_G2),
             KVT_ERR_INVALID_ARGUMENT);
  EXPECT_KVT(kvt_manager_check(m.get()), KVT_OK);
}

// Cancel before commitment: one XFER_DONE with KVT_ERR_CANCELLED, the source intact, and
// nothing registered below.
TEST(Pipeline, CancelAtEveryStageBeforeCommitment) {
  TempDir dir;
  kvt_manager_config c = pipe_config(dir);
  c.min_batch_size = 64;  // a batch waits for its flush interval...
  c.max_batch_size = 64;
  c.flush_interval_us = 60'000'000;  // ...which never comes during this test
  c.policy_g1_g2 = {KVT_POLICY_PASS_ALL, 0};  // so that each container keeps its blocks
  auto m = make(c);
  std::vector<uint64_t> h = {1, 2, 3};
  std::vector<std::vector<unsigned char>> want;
  auto g1 = computed(m.get(), h, &want, 3);
  drain(m.get());
  kvt_fence *fence = nullptr;
  ASSERT_KVT_OK(kvt_fence_create(&fence, m.get()));

  struct Case {
    const char *stage;
    kvt_fence *f;
    uint32_t expect_state;
  } cases[] = {{"waiting on an unsignalled fence", fence, KVT_XFER_WAITING},
               {"batched, not yet flushed", nullptr, KVT_XFER_BATCHED}};
  for (const Case &cs : cases) {
    SCOPED_TRACE(cs.stage);
    kvt_xfer *x = nullptr;
    ASSERT_KVT_OK(kvt_xfer_offload(&x, m.get(), g1.data(), 3, KVT_TIER_G2, cs.f, 42));
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (state_of_xfer(x) != cs.expect_state && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    ASSERT_EQ(state_of_xfer(x), cs.expect_state);
    ASSERT_KVT_OK(kvt_xfer_cancel(x));
    // Confirmed by the time cancel returns, without any sweep.
    auto ev = xfer_events(drain(m.get()));
    ASSERT_EQ(ev.size(), 1u);
    EXPECT_EQ(ev[0].status, KVT_ERR_CANCELLED);
    EXPECT_EQ(ev[0].xfer, x);
    EXPECT_EQ(ev[0].user_data, 42u);
    EXPECT_EQ(ev[0].count, 0u);
    EXPECT_KVT(kvt_xfer_wait(x, 0), KVT_ERR_CANCELLED);
    EXPECT_EQ(state_of_xfer(x), uint32_t(KVT_XFER_CANCELLED));
    ASSERT_KVT_OK(kvt_xfer_cancel(x));  // again: a no-op, and no second event
    EXPECT_TRUE(drain(m.get()).empty());
    kvt_xfer_release(x);
    EXPECT_EQ(matched(m.get(), KVT_TIER_G2, h), 0u);
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_EQ(bytes_of(m.get(), g1[i]), want[i]);
      EXPECT_EQ(info(m.get(), g1[i]).refs, 1u);
    }
  }
  // Before policy evaluation: many containers queue up behind each other; cancel the last
  // at once. Whatever stage it reached, it had not committed (its fence is unsignalled).
  bool saw_queued = false;
  for (int trial = 0; trial < 20 && !saw_queued; ++trial) {
    std::vector<kvt_xfer *> xs(200);
    for (auto &x : xs)
      ASSERT_KVT_OK(kvt_xfer_offload(&x, m.get(), g1.data(), 3, KVT_TIER_G2, fence, 0));
    saw_queued = state_of_xfer(xs.back()) == KVT_XFER_QUEUED;
    for (auto it = xs.rbegin(); it != xs.rend(); ++it) ASSERT_KVT_OK(kvt_xfer_cancel(*it));
    auto ev = xfer_events(drain(m.get()));
    EXPECT_EQ(ev.size(), xs.size());
    for (auto &e : ev) EXPECT_EQ(e.status, KVT_ERR_CANCELLED);
    for (auto x : xs) kvt_xfer_release(x);
  }
  EXPECT_TRUE(saw_queued) << "never caught a container before its policy evaluation";
  EXPECT_EQ(matched(m.get(), KVT_TIER_G2, h), 0u);
  kvt_fence_destroy(fence);
  EXPECT_KVT(kvt_manager_check(m.get()), KVT_OK);
}

TEST(Pipeline, CancelAfterCommitmentFinishesOk) {
  TempDir dir;
  kvt_manager_config c = small_config(64, 64, 64);
  c.chunk_bytes = 1 << 20;  // 4 MiB blocks: the copy to G3 takes a while
  c.g3_path = dir.path.c_str();
  c.min_batch_size = 1;
  auto m = make(c);
  std::vector<uint64_t> h;
  for (uint64_t i = 1; i <= 48; ++i) h.push_back(i);
  auto g1 = computed(m.get(), h, nullptr, 4);
  drain(m.get());
  kvt_xfer *x = nullptr;
  ASSERT_KVT_OK(kvt_xfer_offload(&x, m.get(), g1.data(), h.size(), KVT_TIER_G3, nullptr, 5));
  uint32_t st;
  while ((st = state_of_xfer(x)) != KVT_XFER_INFLIGHT && st != KVT_XFER_DONE) {
  }
  if (st == KVT_XFER_DONE) GTEST_SKIP() << "the copy ended before the test could see it in flight";
  ASSERT_KVT_OK(kvt_xfer_cancel(x));  // too late: it finishes
  ASSERT_KVT_OK(finish(x));
  auto ev = xfer_events(drain(m.get()));
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].status, KVT_OK);
  EXPECT_EQ(ev[0].count, h.size());
  kvt_xfer_release(x);
  EXPECT_EQ(matched(m.get(), KVT_TIER_G3, h), h.size());
}

TEST(Pipeline, EvictedSourceIsDroppedAndCounted) {
  TempDir dir;
  auto m = make(pipe_config(dir, 4, 8, 0));
  std::vector<uint64_t> h = {1, 2, 3, 4};
  auto g1 = computed(m.get(), h, nullptr, 5);
  kvt_fence *f = nullptr;
  ASSERT_KVT_OK(kvt_fence_create(&f, m.get()));
  kvt_xfer *x = nullptr;
  ASSERT_KVT_OK(kvt_xfer_offload(&x, m.get(), g1.data(), 4, KVT_TIER_G2, f, 0));
  // The host lets go of the tail two, and they are evicted before the fence is signalled.
  ASSERT_KVT_OK(kvt_block_release(m.get(), g1.data() + 2, 2));
  auto fresh = alloc(m.get(), 2);
  ASSERT_KVT_OK(kvt_fence_signal(f));
  ASSERT_KVT_OK(finish(x));
  uint64_t count = 0;
  ASSERT_KVT_OK(kvt_xfer_status(nullptr, nullptr, &count, x));
  EXPECT_EQ(count, 2u);
  kvt_xfer_release(x);
  kvt_fence_destroy(f);
  EXPECT_EQ(matched(m.get(), KVT_TIER_G2, h), 2u);
  EXPECT_KVT(kvt_manager_check(m.get()), KVT_OK);
}

TEST(Pipeline, CorruptG3SlotFailsOnboardAndHandsNothingOn) {
  TempDir dir;
  auto m = make(pipe_config(dir));
  std::vector<uint64_t> h = {11, 12};
  auto g1 = computed(m.get(), h, nullptr, 6);
  kvt_xfer *x = nullptr;
  ASSERT_KVT_OK(kvt_xfer_offload(&x, m.get(), g1.data(), 2, KVT_TIER_G3, nullptr, 0));
  ASSERT_KVT_OK(finish(x));
  kvt_xfer_release(x);
  ASSERT_KVT_OK(kvt_block_release(m.get(), g1.data(), 2));
  evict_all(m.get(), KVT_TIER_G1);
  // Flip bytes in the middle of the second slot's data, on disk.
  std::string file = dir.g3_file();
  ASSERT_FALSE(file.empty());
  int fd = open(file.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  const off_t slot_bytes = 4096 + 4096, slot = 1;  // 4 KiB of data + 4 KiB header
  unsigned char b[16];
  ASSERT_EQ(pread(fd, b, sizeof b, slot * slot_bytes + 100), ssize_t(sizeof b));
  for (auto &v : b) v ^= 0x5a;
  ASSERT_EQ(pwrite(fd, b, sizeof b, slot * slot_bytes + 100), ssize_t(sizeof b));
  close(fd);
  std::vector<kvt_block> src;
  ASSERT_EQ(matched(m.get(), KVT_TIER_G3, h, &src), 2u);
  auto dst = alloc(m.get(), 2);
  std::vector<std::vector<unsigned char>> before = {bytes_of(m.get(), dst[0]),
                                                    bytes_of(m.get(), dst[1])};
  drain(m.get());
  ASSERT_KVT_OK(kvt_xfer_onboard(&x, m.get(), src.data(), dst.data(), 2, nullptr, 0));
  EXPECT_KVT(finish(x), KVT_ERR_CORRUPT);
  EXPECT_NE(std::string(kvt_last_error()).find("slot 1"), std::string::npos) << kvt_last_error();
  kvt_block fin[2];
  EXPECT_KVT(kvt_xfer_blocks(fin, 2, x), KVT_ERR_STATE);
  kvt_xfer_release(x);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(state_of(m.get(), dst[i]), uint32_t(KVT_BLOCK_EMPTY));
    EXPECT_EQ(info(m.get(), dst[i]).refs, 1u);
    EXPECT_EQ(bytes_of(m.get(), dst[i]), before[i]) << "bytes were handed on";
  }
  EXPECT_EQ(matched(m.get(), KVT_TIER_G1, h), 0u);
  for (auto &e : drain(m.get())) EXPECT_NE(e.type, uint32_t(KVT_EVENT_BLOCK_STORED));
  ASSERT_KVT_OK(kvt_block_release(m.get(), dst.data(), 2));
  ASSERT_KVT_OK(kvt_block_release(m.get(), src.data(), 2));
  EXPECT_KVT(kvt_manager_check(m.get()), KVT_OK);
}

TEST(Pipeline, InjectedIoFailureFailsOnlyThatTransfer) {
  TempDir dir;
  kvt_manager_config c = pipe_config(dir);
  c.g3_fault_op = KVT_G3_FAULT_WRITE;  // the first G3 write fails with ENOSPC
  c.g3_fault_errno = ENOSPC;
  c.g3_fault_count = 1;
  auto m = make(c);
  kvt_tier_stats g3_before = stats(m.get(), KVT_TIER_G3);
  auto a = computed(m.get(), {1}, nullptr, 7);
  auto b = computed(m.get(), {2}, nullptr, 8);
  kvt_xfer *x = nullptr, *y = nullptr;
  ASSERT_KVT_OK(kvt_xfer_offload(&x, m.get(), a.data(), 1, KVT_TIER_G3, nullptr, 0));
  EXPECT_KVT(finish(x), KVT_ERR_IO);
  EXPECT_NE(std::string(kvt_last_error()).find("No space left"), std::string::npos)
      << kvt_last_error();
  ASSERT_KVT_OK(kvt_xfer_offload(&y, m.get(), b.data(), 1, KVT_TIER_G3, nullptr, 0));
  ASSERT_KVT_OK(finish(y));
  kvt_xfer_release(x);
  kvt_xfer_release(y);
  EXPECT_EQ(matched(m.get(), KVT_TIER_G3, {1}), 0u);
  EXPECT_EQ(matched(m.get(), KVT_TIER_G3, {2}), 1u);
  kvt_tier_stats g3 = stats(m.get(), KVT_TIER_G3);
  EXPECT_EQ(g3.free + g3.inactive, g3_before.free) << "a G3 block leaked";
  EXPECT_EQ(g3.active, 0u);
  EXPECT_EQ(info(m.get(), a[0]).refs, 1u) << "the source lost or kept a reference";
  EXPECT_KVT(kvt_manager_check(m.get()), KVT_OK);
}

TEST(Pipeline, PresenceStoresABlockOnceEvenWhenTwoTransfersRace) {
  TempDir dir;
  auto m = make(pipe_config(dir, 16, 16, 0));
  std::vector<uint64_t> h = {1, 2, 3, 4, 5, 6};
  auto g1 = computed(m.get(), h, nullptr, 9);
  for (int round = 0; round < 2; ++round) {
    kvt_xfer *a = nullptr, *b = nullptr;
    ASSERT_KVT_OK(kvt_xfer_offload(&a, m.get(), g1.data(), 6, KVT_TIER_G2, nullptr, 0));
    ASSERT_KVT_OK(kvt_xfer_offload(&b, m.get(), g1.data(), 6, KVT_TIER_G2, nullptr, 0));
    ASSERT_KVT_OK(finish(a));
    ASSERT_KVT_OK(finish(b));
    uint64_t ca = 0, cb = 0;
    kvt_xfer_status(nullptr, nullptr, &ca, a);
    kvt_xfer_status(nullptr, nullptr, &cb, b);
    EXPECT_EQ(ca + cb, round == 0 ? 6u : 0u);
    kvt_xfer_release(a);
    kvt_xfer_release(b);
  }
  kvt_tier_stats s = stats(m.get(), KVT_TIER_G2);
  EXPECT_EQ(s.registrations, 6u);
  EXPECT_EQ(s.dedups, 0u);
  EXPECT_EQ(s.allocs, 6u) << "presence should have kept the copies from being made";
}

TEST(Pipeline, FrequencyPolicyNeedsRepeatedOffers) {
  TempDir dir;
  kvt_manager_config c = pipe_config(dir, 16, 16, 0);
  c.policy_g1_g2 = {KVT_POLICY_FREQUENCY | KVT_POLICY_PRESENCE, 3};
  auto m = make(c);
  auto g1 = computed(m.get(), {1, 2}, nullptr, 10);
  for (int offer = 1; offer <= 3; ++offer) {
    kvt_xfer *x = nullptr;
    ASSERT_KVT_OK(kvt_xfer_offload(&x, m.get(), g1.data(), 2, KVT_TIER_G2, nullptr, 0));
    ASSERT_KVT_OK(finish(x));
    uint64_t count = 0;
    kvt_xfer_status(nullptr, nullptr, &count, x);
    EXPECT_EQ(count, offer < 3 ? 0u : 2u) << "offer " << offer;
    kvt_xfer_release(x);
  }
  EXPECT_EQ(matched(m.get(), KVT_TIER_G2, {1, 2}), 2u);
}

TEST(Pipeline, PassAllCopiesAgainButRegistersOnce) {
  TempDir dir;
  kvt_manager_config c = pipe_config(dir, 16, 16, 0);
  c.policy_g1_g2 = {KVT_POLICY_PASS_ALL, 0};
  auto m = make(c);
  auto g1 = computed(m.get(), {1, 2}, nullptr, 11);
  for (int i = 0; i < 2; ++i) {
    kvt_xfer *x = nullptr;
    ASSERT_KVT_OK(kvt_xfer_offload(&x, m.get(), g1.data(), 2, KVT_TIER_G2, nullptr, 0));
    ASSERT_KVT_OK(finish(x));
    kvt_xfer_release(x);
  }
  kvt_tier_stats s = stats(m.get(), KVT_TIER_G2);
  EXPECT_EQ(s.registrations, 2u);
  EXPECT_EQ(s.dedups, 2u);
  EXPECT_EQ(s.registered, 2u);
}

TEST(Pipeline, ReleaseWithdrawsEventsAndDestroyCancelsPending) {
  TempDir dir;
  auto m = make(pipe_config(dir));
  auto g1 = computed(m.get(), {1, 2}, nullptr, 12);
  drain(m.get());
  kvt_xfer *x = nullptr;
  ASSERT_KVT_OK(kvt_xfer_offload(&x, m.get(), g1.data(), 2, KVT_TIER_G2, nullptr, 0));
  ASSERT_KVT_OK(finish(x));
  kvt_xfer_release(x);  // its XFER_DONE was queued: it is withdrawn
  for (auto &e : drain(m.get())) EXPECT_NE(e.type, uint32_t(KVT_EVENT_XFER_DONE));
  // Pending transfers at destroy: no hang, no leak (ASan checks the latter).
  kvt_fence *f = nullptr;
  ASSERT_KVT_OK(kvt_fence_create(&f, m.get()));
  kvt_xfer *y = nullptr, *z = nullptr;
  ASSERT_KVT_OK(kvt_xfer_offload(&y, m.get(), g1.data(), 2, KVT_TIER_G3, f, 0));
  ASSERT_KVT_OK(kvt_xfer_offload(&z, m.get(), g1.data(), 2, KVT_TIER_G3, nullptr, 0));
  m.reset();
}

TEST(Pipeline, DestroyedFenceCancelsItsWaiters) {
  TempDir dir;
  auto m = make(pipe_config(dir));
  auto g1 = computed(m.get(), {1}, nullptr, 13);
  kvt_fence *f = nullptr;
  ASSERT_KVT_OK(kvt_fence_create(&f, m.get()));
  kvt_xfer *x = nullptr;
  ASSERT_KVT_OK(kvt_xfer_offload(&x, m.get(), g1.data(), 1, KVT_TIER_G2, f, 0));
  while (state_of_xfer(x) != KVT_XFER_WAITING) std::this_thread::yield();
  kvt_fence_destroy(f);
  EXPECT_KVT(kvt_xfer_wait(x, 0), KVT_ERR_CANCELLED);
  EXPECT_NE(std::string(kvt_last_error()).find("fence"), std::string::npos);
  kvt_xfer_release(x);
}

TEST(Pipeline, OnboardDedupsAgainstABlockRegisteredMeanwhile) {
  TempDir dir;
  auto m = make(pipe_config(dir));
  auto g1 = computed(m.get(), {1}, nullptr, 14);
  kvt_xfer *x = nullptr;
  ASSERT_KVT_OK(kvt_xfer_offload(&x, m.get(), g1.data(), 1, KVT_TIER_G2, nullptr, 0));
  ASSERT_KVT_OK(finish(x));
  kvt_xfer_release(x);
  std::vector<kvt_block> src;
  ASSERT_EQ(matched(m.get(), KVT_TIER_G2, {1}, &src), 1u);
  auto dst = alloc(m.get(), 1);
  ASSERT_KVT_OK(kvt_xfer_onboard(&x, m.get(), src.data(), dst.data(), 1, nullptr, 0));
  ASSERT_KVT_OK(finish(x));
  kvt_block fin = 0;
  ASSERT_KVT_OK(kvt_xfer_blocks(&fin, 1, x));
  EXPECT_EQ(fin, g1[0]);  // G1 still held hash 1: the caller gets that block
  EXPECT_EQ(info(m.get(), g1[0]).refs, 2u);
  kvt_block_info bi{};
  bi.struct_size = sizeof bi;
  EXPECT_KVT(kvt_block_info_get(&bi, m.get(), dst[0]), KVT_ERR_INVALID_HANDLE);
  kvt_xfer_release(x);
  EXPECT_KVT(kvt_manager_check(m.get()), KVT_OK);
}

TEST(Pipeline, BadInput) {
  TempDir dir;
  auto m = make(pipe_config(dir));
  auto g1 = computed(m.get(), {1}, nullptr, 15);
  auto empty = alloc(m.get(), 1);
  kvt_xfer *x = reinterpret_cast<kvt_xfer *>(0x1);
  kvt_block bad = 0x12345;
  EXPECT_KVT(kvt_xfer_offload(nullptr, m.get(), g1.data(), 1, KVT_TIER_G2, nullptr, 0),
             KVT_ERR_INVALID_ARGUMENT);
  EXPECT_KVT(kvt_xfer_offload(&x, nullptr, g1.data(), 1, KVT_TIER_G2, nullptr, 0),
             KVT_ERR_INVALID_ARGUMENT);
  EXPECT_KVT(kvt_xfer_offload(&x, m.get(), nullptr, 1, KVT_TIER_G2, nullptr, 0),
             KVT_ERR_INVALID_ARGUMENT);
  EXPECT_KVT(kvt_xfer_offload(&x, m.get(), &bad, 1, KVT_TIER_G2, nullptr, 0),
             KVT_ERR_INVALID_HANDLE);
  EXPECT_KVT(kvt_xfer_offload(&x, m.get(), empty.data(), 1, KVT_TIER_G2, nullptr, 0),
             KVT_ERR_STATE);
  EXPECT_KVT(kvt_xfer_offload(&x, m.get(), g1.data(), 1, KVT_TIER_G1, nullptr, 0),
             KVT_ERR_INVALID_ARGUMENT);
  EXPECT_KVT(kvt_xfer_offload(&x, m.get(), g1.data(), 1, kvt_tier(9), nullptr, 0),
             KVT_ERR_INVALID_ARGUMENT);
  EXPECT_KVT(kvt_xfer_offload(&x, m.get(), g1.data(), 1, KVT_TIER_G2,
                              reinterpret_cast<kvt_fence *>(g1.data()), 0), KVT_ERR_INVALID_HANDLE);
  EXPECT_KVT(kvt_xfer_onboard(&x, m.get(), g1.data(), empty.data(), 1, nullptr, 0),
             KVT_ERR_INVALID_ARGUMENT);
  EXPECT_KVT(kvt_xfer_onboard(&x, m.get(), g1.data(), nullptr, 1, nullptr, 0),
             KVT_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(x, reinterpret_cast<kvt_xfer *>(0x1)) << "out touched on failure";
  EXPECT_KVT(kvt_xfer_cancel(nullptr), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_KVT(kvt_xfer_wait(nullptr, 0), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_KVT(kvt_xfer_status(nullptr, nullptr, nullptr, nullptr), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_KVT(kvt_xfer_cancel(reinterpret_cast<kvt_xfer *>(m.get())), KVT_ERR_INVALID_HANDLE);
  EXPECT_KVT(kvt_fence_signal(nullptr), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_KVT(kvt_fence_create(nullptr, m.get()), KVT_ERR_INVALID_ARGUMENT);
  kvt_fence *f = nullptr;
  int dummy = 0;
  kvt_status s = kvt_fence_from_cuda_event(&f, m.get(), &dummy);
  EXPECT_TRUE(s == KVT_ERR_UNSUPPORTED || s == KVT_OK) << kvt_status_str(s);
  if (s == KVT_OK) kvt_fence_destroy(f);
  kvt_xfer_release(nullptr);
  kvt_fence_destroy(nullptr);
  // An offload of nothing ends at once with nothing moved.
  ASSERT_KVT_OK(kvt_xfer_offload(&x, m.get(), nullptr, 0, KVT_TIER_G2, nullptr, 0));
  ASSERT_KVT_OK(finish(x));
  kvt_xfer_release(x);
  EXPECT_KVT(kvt_manager_check(m.get()), KVT_OK);
}

// Found by fuzz_api: an empty transfer has no source tier, and the executor used to reach
// for it. Empty offloads and onboards end with KVT_OK and a count of 0.
TEST(Pipeline, EmptyTransfersEndOkWithNothingMoved) {
  TempDir dir;
  auto m = make(pipe_config(dir));
  kvt_xfer *a = nullptr, *b = nullptr;
  ASSERT_KVT_OK(kvt_xfer_offload(&a, m.get(), nullptr, 0, KVT_TIER_G3, nullptr, 1));
  ASSERT_KVT_OK(kvt_xfer_onboard(&b, m.get(), nullptr, nullptr, 0, nullptr, 2));
  for (kvt_xfer *x : {a, b}) {
    ASSERT_KVT_OK(finish(x));
    uint64_t count = 99;
    kvt_status result = KVT_AGAIN;
    ASSERT_KVT_OK(kvt_xfer_status(nullptr, &result, &count, x));
    EXPECT_EQ(result, KVT_OK);
    EXPECT_EQ(count, 0u);
    kvt_xfer_release(x);
  }
  EXPECT_KVT(kvt_manager_check(m.get()), KVT_OK);
}
