// kvt_manager_reset: every tier or one, with nothing in flight, with transfers parked,
// batched and copying, with blocks the host holds, with a full event queue, and racing other
// threads' offloads, onboards and matches.
#include <atomic>
#include <map>
#include <mutex>
#include <set>

#include "connector_support.hpp"
#include "test_xfer_support.hpp"

using namespace kvt_xfer_test;

namespace {

// A (type, tier) pair of an event, and the hashes of BLOCK_REMOVED events by tier.
struct Seen {
  std::vector<std::pair<uint32_t, uint32_t>> kinds;
  std::map<uint32_t, std::multiset<uint64_t>> removed;
  std::map<kvt_xfer *, std::vector<kvt_status>> done;
  uint64_t dropped = 0;
  explicit Seen(const std::vector<kvt_event> &events) {
    for (const kvt_event &e : events) {
      if (e.type == KVT_EVENT_BLOCK_REMOVED) removed[e.tier].insert(e.hash);
      if (e.type == KVT_EVENT_XFER_DONE) done[e.xfer].push_back(e.status);
      if (e.type == KVT_EVENT_EVENTS_DROPPED) dropped += e.count;
      if (e.type != KVT_EVENT_XFER_DONE) kinds.push_back({e.type, e.tier});
    }
  }
};

// The events of a reset of these tiers, each of which held `n[t]` registered blocks.
std::vector<std::pair<uint32_t, uint32_t>> reset_events(
    const std::vector<std::pair<uint32_t, size_t>> &n) {
  std::vector<std::pair<uint32_t, uint32_t>> v;
  for (auto [t, k] : n) {
    for (size_t i = 0; i < k; ++i) v.push_back({KVT_EVENT_BLOCK_REMOVED, t});
    v.push_back({KVT_EVENT_TIER_CLEARED, t});
  }
  return v;
}

// Registers blocks under hashes in tier t and releases them: inactive, matchable.
void inactive(kvt_manager *m, const std::vector<uint64_t> &h, kvt_tier t) {
  auto b = store(m, h, t);
  ASSERT_KVT_OK(kvt_block_release(m, b.data(), b.size()));
}

void expect_empty_tier(kvt_manager *m, kvt_tier t, uint64_t held = 0) {
  kvt_tier_stats s = stats(m, t);
  EXPECT_EQ(s.registered, 0u) << "G" << int(t);
  EXPECT_EQ(s.inactive, 0u) << "G" << int(t);
  EXPECT_EQ(s.active, held) << "G" << int(t);
  EXPECT_EQ(s.free, s.capacity - held) << "G" << int(t);
}

// Byte k of the bytes a block of hash h holds in these tests.
uint8_t byte_of(uint64_t h, size_t k) { return uint8_t((h * 131) ^ (k * 7) ^ (k >> 8)); }

void fill_for(kvt_manager *m, kvt_block b, uint64_t h) {
  void *p = nullptr;
  size_t len = 0;
  ASSERT_KVT_OK(kvt_block_data(&p, &len, m, b));
  for (size_t k = 0; k < len; ++k) static_cast<uint8_t *>(p)[k] = byte_of(h, k);
}

bool holds(kvt_manager *m, kvt_block b, uint64_t h) {
  void *p = nullptr;
  size_t len = 0;
  if (kvt_block_data(&p, &len, m, b) != KVT_OK) return false;
  for (size_t k = 0; k < len; ++k)
    if (static_cast<uint8_t *>(p)[k] != byte_of(h, k)) return false;
  return true;
}

void wait_state(kvt_xfer *x, uint32_t want) {
  for (int i = 0; i < 5000 && state_of_xfer(x) != want; ++i) std::this_thread::sleep_for(1ms);
  ASSERT_EQ(state_of_xfer(x), want);
}

}  // namespace

TEST(Reset, EmptiesEveryTierAndSaysSo) {
  TempDir dir;
  auto m = make(xfer_config(dir, 8, 8, 8));
  inactive(m.get(), {1, 2}, KVT_TIER_G1);
  inactive(m.get(), {11, 12, 13}, KVT_TIER_G2);
  inactive(m.get(), {21}, KVT_TIER_G3);
  drain(m.get());
  ASSERT_KVT_OK(kvt_manager_reset(m.get(), 0));
  Seen seen(drain(m.get()));
  EXPECT_EQ(seen.kinds, reset_events({{1, 2}, {2, 3}, {3, 1}}));
  EXPECT_EQ(seen.removed[1], (std::multiset<uint64_t>{1, 2}));
  EXPECT_EQ(seen.removed[2], (std::multiset<uint64_t>{11, 12, 13}));
  EXPECT_EQ(seen.removed[3], (std::multiset<uint64_t>{21}));
  for (kvt_tier t : {KVT_TIER_G1, KVT_TIER_G2, KVT_TIER_G3}) expect_empty_tier(m.get(), t);
  EXPECT_EQ(matched(m.get(), KVT_TIER_G1, {1, 2}), 0u);
  EXPECT_EQ(matched(m.get(), KVT_TIER_G2, {11}), 0u);
  EXPECT_EQ(matched(m.get(), KVT_TIER_G3, {21}), 0u);
  EXPECT_KVT(kvt_manager_check(m.get()), KVT_OK);

  // An empty tier resets too, with its TIER_CLEARED alone; the same hashes register anew.
  ASSERT_KVT_OK(kvt_manager_reset(m.get(), KVT_TIER_G2));
  EXPECT_EQ(Seen(drain(m.get())).kinds, reset_events({{2, 0}}));
  uint64_t before = stats(m.get(), KVT_TIER_G1).registrations;
  inactive(m.get(), {1, 2}, KVT_TIER_G1);
  EXPECT_EQ(stats(m.get(), KVT_TIER_G1).registrations, before + 2);
  EXPECT_EQ(stats(m.get(), KVT_TIER_G1).dedups, 0u);
  EXPECT_EQ(matched(m.get(), KVT_TIER_G1, {1, 2}), 2u);
  EXPECT_KVT(kvt_manager_check(m.get()), KVT_OK);
}

TEST(Reset, OneTierLeavesTheOthersAlone) {
  TempDir dir;
  auto m = make(xfer_config(dir, 8, 8, 8));
  inactive(m.get(), {1, 2}, KVT_TIER_G1);
  inactive(m.get(), {11}, KVT_TIER_G2);
  inactive(m.get(), {21, 22}, KVT_TIER_G3);
  drain(m.get());
  ASSERT_KVT_OK(kvt_manager_reset(m.get(), KVT_TIER_G3));
  Seen seen(drain(m.get()));
  EXPECT_EQ(seen.kinds, reset_events({{3, 2}}));
  EXPECT_EQ(seen.removed[3], (std::multiset<uint64_t>{21, 22}));
  expect_empty_tier(m.get(), KVT_TIER_G3);
  EXPECT_EQ(matched(m.get(), KVT_TIER_G1, {1, 2}), 2u);
  EXPECT_EQ(matched(m.get(), KVT_TIER_G2, {11}), 1u);
  EXPECT_EQ(stats(m.get(), KVT_TIER_G1).registered, 2u);
  EXPECT_KVT(kvt_manager_check(m.get()), KVT_OK);
}

TEST(Reset, RefusesWhatIsNotATier) {
  TempDir dir;
  auto m = make(xfer_config(dir, 8, 8, 0));
  inactive(m.get(), {1}, KVT_TIER_G1);
  drain(m.get());
  Snapshot snap(m.get());
  for (int t : {-1, 4, 1 << 30, int(KVT_TIER_G3) /* absent */}) {
    kvt_hash_salt(nullptr, nullptr, 0);  // leaves a known message
    std::string stale = kvt_last_error();
    EXPECT_KVT(kvt_manager_reset(m.get(), t), KVT_ERR_INVALID_ARGUMENT);
    EXPECT_NE(stale, kvt_last_error()) << t;
    EXPECT_NE(std::string(kvt_last_error()).find("tier"), std::string::npos) << kvt_last_error();
  }
  EXPECT_KVT(kvt_manager_reset(nullptr, 0), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(Snapshot(m.get()) == snap);
  EXPECT_TRUE(drain(m.get()).empty());
  EXPECT_EQ(matched(m.get(), KVT_TIER_G1, {1}), 1u);
}

// Blocks the host holds leave the registry but keep their bytes until released; then they
// are freed, not made inactive.
TEST(Reset, HeldBlocksStayReadableUntilReleased) {
  TempDir dir;
  auto m = make(xfer_config(dir, 8, 8, 0));
  auto g1 = alloc(m.get(), 3);
  for (size_t i = 0; i < 3; ++i) fill_for(m.get(), g1[i], 1 + i);
  std::vector<uint64_t> h = {1, 2, 3};
  ASSERT_KVT_OK(kvt_block_register_hashes(g1.data(), m.get(), g1.data(), h.data(), 3, 0));
  ASSERT_KVT_OK(kvt_block_release(m.get(), &g1[2], 1));  // inactive
  inactive(m.get(), {11}, KVT_TIER_G2);
  std::vector<kvt_block> g2;
  ASSERT_EQ(matched(m.get(), KVT_TIER_G2, {11}, &g2), 1u);
  auto mutable_block = alloc(m.get(), 1);  // not registered: untouched
  drain(m.get());

  ASSERT_KVT_OK(kvt_manager_reset(m.get(), 0));
  Seen seen(drain(m.get()));
  EXPECT_EQ(seen.removed[1], (std::multiset<uint64_t>{1, 2, 3}));
  EXPECT_EQ(seen.removed[2], (std::multiset<uint64_t>{11}));
  expect_empty_tier(m.get(), KVT_TIER_G1, 3);
  expect_empty_tier(m.get(), KVT_TIER_G2, 1);
  EXPECT_KVT(kvt_manager_check(m.get()), KVT_OK);
  EXPECT_TRUE(holds(m.get(), g1[0], 1) && holds(m.get(), g1[1], 2)) << "held bytes changed";
  EXPECT_EQ(info(m.get(), g1[0]).refs, 1u);
  EXPECT_EQ(state_of(m.get(), mutable_block[0]), uint32_t(KVT_BLOCK_EMPTY));
  EXPECT_EQ(matched(m.get(), KVT_TIER_G1, h), 0u);
  EXPECT_EQ(matched(m.get(), KVT_TIER_G2, {11}), 0u);
  // No longer registered: neither retained nor transferred.
  EXPECT_KVT(kvt_block_retain(m.get(), g1[0]), KVT_ERR_STATE);
  kvt_xfer *x = nullptr;
  EXPECT_KVT(kvt_xfer_offload(&x, m.get(), &g1[0], 1, KVT_TIER_G2, nullptr, 0), KVT_ERR_STATE);
  // A registration of the same hash is a new block, not the held one.
  auto again = alloc(m.get(), 1);
  fill_for(m.get(), again[0], 1);
  kvt_block reg = 0;
  ASSERT_KVT_OK(kvt_block_register_hash(&reg, m.get(), again[0], 1, 0));
  EXPECT_EQ(reg, again[0]);
  EXPECT_EQ(stats(m.get(), KVT_TIER_G1).dedups, 0u);
  EXPECT_TRUE(holds(m.get(), g1[0], 1));
  drain(m.get());

  // Released: freed at once, their handles stale.
  ASSERT_KVT_OK(kvt_block_release(m.get(), g1.data(), 2));
  ASSERT_KVT_OK(kvt_block_release(m.get(), g2.data(), 1));
  kvt_block_info i{};
  i.struct_size = sizeof i;
  EXPECT_KVT(kvt_block_info_get(&i, m.get(), g1[0]), KVT_ERR_INVALID_HANDLE);
  EXPECT_KVT(kvt_block_info_get(&i, m.get(), g2[0]), KVT_ERR_INVALID_HANDLE);
  expect_empty_tier(m.get(), KVT_TIER_G2);
  kvt_tier_stats s1 = stats(m.get(), KVT_TIER_G1);
  EXPECT_EQ(s1.registered, 1u);
  EXPECT_EQ(s1.active, 2u);  // `reg` and the mutable block
  EXPECT_EQ(s1.free, 6u);
  EXPECT_TRUE(drain(m.get()).empty()) << "a release after the reset emitted an event";
  ASSERT_KVT_OK(kvt_block_release(m.get(), &reg, 1));
  ASSERT_KVT_OK(kvt_block_release(m.get(), mutable_block.data(), 1));
  EXPECT_EQ(matched(m.get(), KVT_TIER_G1, {1}), 1u);
  expect_all_returned(m.get());
}

// The queue is full of the reset's BLOCK_REMOVED events and more come after: TIER_CLEARED
// is still delivered, like XFER_DONE.
TEST(Reset, TierClearedSurvivesAFullEventQueue) {
  TempDir dir;
  kvt_manager_config c = xfer_config(dir, 8, 32, 0);
  c.event_capacity = 4;
  auto m = make(c);
  std::vector<uint64_t> h;
  for (uint64_t i = 0; i < 20; ++i) h.push_back(100 + i);
  inactive(m.get(), h, KVT_TIER_G2);
  drain(m.get());
  ASSERT_KVT_OK(kvt_manager_reset(m.get(), KVT_TIER_G2));
  inactive(m.get(), {1, 2, 3, 4, 5, 6}, KVT_TIER_G2);  // six BLOCK_STORED
  Seen seen(drain(m.get()));
  EXPECT_GT(seen.dropped, 0u);
  EXPECT_EQ(std::count(seen.kinds.begin(), seen.kinds.end(),
                       std::pair<uint32_t, uint32_t>{KVT_EVENT_TIER_CLEARED, 2}),
            1);
  EXPECT_KVT(kvt_manager_check(m.get()), KVT_OK);
}

// Transfers not yet committed (parked on a fence, batched) end with KVT_ERR_CANCELLED, one
// XFER_DONE each, and copy nothing; an onboard's destinations stay the caller's.
TEST(Reset, CancelsTransfersNotYetCommitted) {
  TempDir dir;
  kvt_manager_config c = xfer_config(dir, 8, 8, 8);
  c.min_batch_size = c.max_batch_size;  // never enough blocks
  c.flush_interval_us = 60'000'000;     // and a minute before a flush
  auto m = make(c);
  auto g1 = filled(m.get(), {1, 2});
  inactive(m.get(), {11}, KVT_TIER_G2);
  std::vector<kvt_block> src;
  ASSERT_EQ(matched(m.get(), KVT_TIER_G2, {11}, &src), 1u);
  auto dst = alloc(m.get(), 1);
  kvt_fence *f = nullptr;
  ASSERT_KVT_OK(kvt_fence_create(&f, m.get()));
  kvt_xfer *batched = nullptr, *parked = nullptr, *onboard = nullptr;
  ASSERT_KVT_OK(kvt_xfer_offload(&batched, m.get(), g1.data(), 2, KVT_TIER_G2, nullptr, 1));
  ASSERT_KVT_OK(kvt_xfer_offload(&parked, m.get(), g1.data(), 2, KVT_TIER_G3, f, 2));
  ASSERT_KVT_OK(kvt_xfer_onboard(&onboard, m.get(), src.data(), dst.data(), 1, f, 3));
  wait_state(batched, KVT_XFER_BATCHED);
  wait_state(parked, KVT_XFER_WAITING);
  wait_state(onboard, KVT_XFER_WAITING);
  drain(m.get());

  ASSERT_KVT_OK(kvt_manager_reset(m.get(), 0));
  for (kvt_xfer *x : {batched, parked, onboard}) {
    EXPECT_EQ(state_of_xfer(x), uint32_t(KVT_XFER_CANCELLED));
    EXPECT_KVT(kvt_xfer_wait(x, 0), KVT_ERR_CANCELLED);
  }
  ASSERT_KVT_OK(kvt_fence_signal(f));  // too late: nothing moves
  std::this_thread::sleep_for(20ms);
  Seen seen(drain(m.get()));
  ASSERT_EQ(seen.done.size(), 3u);
  for (kvt_xfer *x : {batched, parked, onboard})
    EXPECT_EQ(seen.done[x], std::vector<kvt_status>{KVT_ERR_CANCELLED});
  for (kvt_tier t : {KVT_TIER_G2, KVT_TIER_G3}) EXPECT_EQ(stats(m.get(), t).registered, 0u);
  EXPECT_EQ(state_of(m.get(), dst[0]), uint32_t(KVT_BLOCK_EMPTY));
  EXPECT_KVT(kvt_manager_check(m.get()), KVT_OK);
  for (kvt_xfer *x : {batched, parked, onboard}) kvt_xfer_release(x);
  kvt_fence_destroy(f);
  ASSERT_KVT_OK(kvt_block_release(m.get(), g1.data(), 2));
  ASSERT_KVT_OK(kvt_block_release(m.get(), src.data(), 1));
  ASSERT_KVT_OK(kvt_block_release(m.get(), dst.data(), 1));
  expect_all_returned(m.get());
  for (kvt_tier t : {KVT_TIER_G1, KVT_TIER_G2, KVT_TIER_G3}) expect_empty_tier(m.get(), t);
}

// A reset of G3 cancels only what touches G3: a batched G1 -> G2 offload goes on.
TEST(Reset, OfOneTierCancelsOnlyTheTransfersTouchingIt) {
  TempDir dir;
  kvt_manager_config c = xfer_config(dir, 8, 8, 8);
  c.min_batch_size = c.max_batch_size;
  c.flush_interval_us = 60'000'000;
  auto m = make(c);
  auto g1 = filled(m.get(), {1, 2});
  kvt_fence *f = nullptr;
  ASSERT_KVT_OK(kvt_fence_create(&f, m.get()));
  kvt_xfer *to_g2 = nullptr, *to_g3 = nullptr;
  ASSERT_KVT_OK(kvt_xfer_offload(&to_g2, m.get(), g1.data(), 2, KVT_TIER_G2, f, 1));
  ASSERT_KVT_OK(kvt_xfer_offload(&to_g3, m.get(), g1.data(), 2, KVT_TIER_G3, f, 2));
  wait_state(to_g2, KVT_XFER_WAITING);
  wait_state(to_g3, KVT_XFER_WAITING);
  ASSERT_KVT_OK(kvt_manager_reset(m.get(), KVT_TIER_G3));
  EXPECT_EQ(state_of_xfer(to_g3), uint32_t(KVT_XFER_CANCELLED));
  EXPECT_EQ(state_of_xfer(to_g2), uint32_t(KVT_XFER_WAITING));
  EXPECT_EQ(stats(m.get(), KVT_TIER_G1).registered, 2u) << "G1 was reset";
  ASSERT_KVT_OK(kvt_fence_signal(f));
  wait_state(to_g2, KVT_XFER_BATCHED);
  ASSERT_KVT_OK(kvt_manager_reset(m.get(), KVT_TIER_G2));
  EXPECT_EQ(state_of_xfer(to_g2), uint32_t(KVT_XFER_CANCELLED));
  Seen seen(drain(m.get()));
  EXPECT_EQ(seen.done[to_g2], std::vector<kvt_status>{KVT_ERR_CANCELLED});
  EXPECT_EQ(seen.done[to_g3], std::vector<kvt_status>{KVT_ERR_CANCELLED});
  kvt_xfer_release(to_g2);
  kvt_xfer_release(to_g3);
  kvt_fence_destroy(f);
  ASSERT_KVT_OK(kvt_block_release(m.get(), g1.data(), 2));
  expect_all_returned(m.get());
}

// A transfer caught in flight: reset waits for its copy, which ends with KVT_OK, and then
// empties the tier of what it stored. A reset that did not wait would leave the copies
// registered after it returned.
TEST(Threads, ResetWaitsForACopyInFlight) {
  TempDir dir;
  const size_t n = RUNNING_ON_VALGRIND ? 256 : 1024;
  kvt_manager_config c = xfer_config(dir, n, 8, n);
  c.max_batch_size = 8;  // many batches: a long time in flight
  auto m = make(c);
  std::vector<uint64_t> h(n);
  for (size_t i = 0; i < n; ++i) h[i] = 1000 + i;
  auto g1 = filled(m.get(), h);
  int caught = 0;
  for (int round = 0; round < 20 && caught < 2; ++round) {
    kvt_xfer *x = nullptr;
    ASSERT_KVT_OK(kvt_xfer_offload(&x, m.get(), g1.data(), n, KVT_TIER_G3, nullptr, 7));
    uint32_t st = 0;
    while ((st = state_of_xfer(x)) < KVT_XFER_INFLIGHT) std::this_thread::yield();
    ASSERT_KVT_OK(kvt_manager_reset(m.get(), KVT_TIER_G3));
    uint32_t after = state_of_xfer(x);
    EXPECT_EQ(after, uint32_t(KVT_XFER_DONE)) << "committed before the reset: it finishes";
    if (st == KVT_XFER_INFLIGHT) ++caught;
    EXPECT_EQ(stats(m.get(), KVT_TIER_G3).registered, 0u) << "round " << round;
    expect_empty_tier(m.get(), KVT_TIER_G3);
    EXPECT_EQ(stats(m.get(), KVT_TIER_G1).registered, n);
    Seen seen(drain(m.get()));
    EXPECT_EQ(seen.done[x], std::vector<kvt_status>{KVT_OK});
    EXPECT_EQ(seen.kinds.back(), (std::pair<uint32_t, uint32_t>{KVT_EVENT_TIER_CLEARED, 3}));
    kvt_xfer_release(x);
    EXPECT_KVT(kvt_manager_check(m.get()), KVT_OK);
  }
  EXPECT_GT(caught, 0) << "no round was reset while its copy was in flight";
  std::printf("  %d of the resets came while the copy was in flight\n", caught);
  ASSERT_KVT_OK(kvt_block_release(m.get(), g1.data(), n));
  expect_all_returned(m.get());
}

// Resets of every tier and of one, while other threads offload, onboard and match: every
// transfer ends once (KVT_OK or KVT_ERR_CANCELLED), every onboarded block holds the bytes of
// its hash, and the invariants hold.
TEST(Threads, ResetWhileOtherThreadsOffloadOnboardAndMatch) {
  TempDir dir;
  kvt_manager_config c = xfer_config(dir, 64, 32, 32);
  c.max_batch_size = 4;
  auto m = make(c);
  const int rounds = RUNNING_ON_VALGRIND ? 30 : 200;
  std::mutex xm;
  std::vector<kvt_xfer *> xfers;  // released at the end, so that every XFER_DONE stays
  auto keep = [&](kvt_xfer *x) {
    std::lock_guard lock(xm);
    xfers.push_back(x);
  };
  std::atomic<int> bad_status{0}, bad_bytes{0}, onboarded{0}, offloaded{0}, cancelled{0};
  std::string why;  // each bad status, with the call it came from
  auto bad = [&](const char *call, kvt_status s) {
    std::lock_guard lock(xm);
    why += std::string(call) + ": " + std::to_string(s) + " " + kvt_last_error() + "\n";
    ++bad_status;
  };
  auto chain = [](int round) {
    std::vector<uint64_t> h(4);
    for (size_t i = 0; i < h.size(); ++i) h[i] = 1 + uint64_t(round % 8) * 16 + i;
    return h;
  };

  std::atomic<int> last{-1};  // the offloader's last round that went through
  std::atomic<bool> stop{false};
  auto dst_of = [](int round) { return round % 3 == 0 ? KVT_TIER_G3 : KVT_TIER_G2; };
  std::thread offloader([&] {
    for (int r = 0; r < rounds; ++r) {
      auto h = chain(r);
      std::vector<kvt_block> b(h.size());
      if (kvt_block_alloc(b.data(), b.size(), m.get(), KVT_TIER_G1) != KVT_OK) continue;
      for (size_t i = 0; i < b.size(); ++i) fill_for(m.get(), b[i], h[i]);
      kvt_block_register_hashes(b.data(), m.get(), b.data(), h.data(), b.size(), 0);
      kvt_xfer *x = nullptr;
      if (kvt_xfer_offload(&x, m.get(), b.data(), b.size(), dst_of(r), nullptr, r) == KVT_OK) {
        keep(x);
        kvt_status s = finish(x);
        if (s != KVT_OK && s != KVT_ERR_CANCELLED) bad("offload", s);
        cancelled += s == KVT_ERR_CANCELLED;
        if (s == KVT_OK) {
          ++offloaded;
          last = r;
        }
      }  // else a block went with a reset between its registration and the offload
      kvt_block_release(m.get(), b.data(), b.size());
    }
    stop = true;
  });
  std::thread onboarder([&] {
    while (!stop) {
      int r = last;
      auto h = chain(r);
      std::vector<kvt_block> src;
      size_t n = r < 0 ? 0 : matched(m.get(), dst_of(r), h, &src);
      if (n == 0) {
        std::this_thread::sleep_for(200us);
        continue;
      }
      std::vector<kvt_block> dst(n);
      if (kvt_block_alloc(dst.data(), n, m.get(), KVT_TIER_G1) != KVT_OK) {
        kvt_block_release(m.get(), src.data(), n);
        continue;
      }
      kvt_xfer *x = nullptr;
      if (kvt_xfer_onboard(&x, m.get(), src.data(), dst.data(), n, nullptr, 1000 + r) != KVT_OK) {
        kvt_block_release(m.get(), src.data(), n);
        kvt_block_release(m.get(), dst.data(), n);
        continue;
      }
      keep(x);
      kvt_status s = finish(x);
      std::vector<kvt_block> mine = dst;  // what the caller holds afterwards
      if (s == KVT_OK) {
        std::vector<kvt_block> fin(n);
        if (kvt_status b = kvt_xfer_blocks(fin.data(), n, x); b != KVT_OK) bad("xfer_blocks", b);
        for (size_t i = 0; i < n; ++i) {
          if (fin[i] == 0) continue;  // dropped: dst[i] stays the caller's
          mine[i] = fin[i];
          if (!holds(m.get(), fin[i], h[i])) ++bad_bytes;
          ++onboarded;
        }
      } else if (s != KVT_ERR_CANCELLED) {
        bad("onboard", s);
      } else {
        ++cancelled;
      }
      kvt_block_release(m.get(), mine.data(), n);
      kvt_block_release(m.get(), src.data(), n);
    }
  });
  std::thread matcher([&] {
    for (int r = 0; !stop; ++r) {
      auto h = chain(r);
      for (kvt_tier t : {KVT_TIER_G1, KVT_TIER_G2, KVT_TIER_G3}) {
        std::vector<kvt_block> got;
        size_t n = matched(m.get(), t, h, &got);
        for (size_t i = 0; i < n && t == KVT_TIER_G1; ++i)
          if (!holds(m.get(), got[i], h[i])) ++bad_bytes;
        kvt_block_release(m.get(), got.data(), n);
      }
    }
  });
  int resets = 0;
  for (; !stop; ++resets) {
    std::this_thread::sleep_for(resets % 2 ? 1ms : 3ms);
    EXPECT_KVT(kvt_manager_reset(m.get(), resets % 4), KVT_OK);
  }
  offloader.join();
  onboarder.join();
  matcher.join();
  EXPECT_EQ(bad_status.load(), 0) << why;
  EXPECT_EQ(bad_bytes.load(), 0);
  Seen seen(drain(m.get()));
  EXPECT_EQ(seen.done.size(), xfers.size());
  for (kvt_xfer *x : xfers) EXPECT_EQ(seen.done[x].size(), 1u) << "XFER_DONE events of a transfer";
  for (kvt_xfer *x : xfers) kvt_xfer_release(x);
  expect_all_returned(m.get());
  std::printf("  %d resets; %d offloads and %d onboarded blocks went through, %d transfers "
              "cancelled\n", resets, offloaded.load(), onboarded.load(), cancelled.load());
}

// The connector pins a load's G2 sources and holds its stores' G2 slots across a reset: the
// load still reads intact bytes from the removed sources, the stores register anew (or
// deduplicate against a block registered since), and every pin goes with the reports.
TEST(Reset, UnderAConnectorHoldingLoadsAndStores) {
  namespace ct = kvt_conn_test;
  ct::Rig r;
  auto b = ct::seed_b();
  auto ha = ct::hashes_of(ct::seed_a()), hb = ct::hashes_of(b);
  r.run_a();
  ASSERT_EQ(r.held(ha), 2u);

  // B's load is planned from A's two G2 blocks, pinned; then G2 is reset.
  EXPECT_EQ(r.match("B", b).first, 32u);
  ASSERT_KVT_OK(r.alloc("B", {4, 5, 6, 7}, 32));
  ASSERT_KVT_OK(kvt_manager_reset(r.m.get(), 0));
  EXPECT_KVT(kvt_manager_check(r.m.get()), KVT_OK);
  EXPECT_EQ(r.held(ha), 0u);
  EXPECT_EQ(stats(r.m.get(), KVT_TIER_G2).active, 2u) << "the load's pins";
  bool loaded = false;
  // G2 lacks A's blocks now: B stores the two it loaded as well as the one it computes.
  ct::Finished f = r.step(r.meta({{"B", 32, 20}}), {{6, hb[2]}}, r.counts(5, 2),
                          [&] { loaded = r.g1.holds(4, ha[0]) && r.g1.holds(5, ha[1]); });
  EXPECT_TRUE(loaded) << "the load read the removed sources' slots wrong";
  EXPECT_TRUE(f.load_errors.empty());
  EXPECT_EQ(r.finish("B"), 0);
  EXPECT_EQ(r.g2_holding(hb), 3u) << "B's blocks are not in G2 with their bytes";
  EXPECT_EQ(stats(r.m.get(), KVT_TIER_G2).active, 0u) << "pins left after the reports";
  EXPECT_KVT(kvt_manager_check(r.m.get()), KVT_OK);

  // C's two blocks are being stored when G2 is reset, and the host registers C's first hash
  // in G2 meanwhile: the store of that one deduplicates, the other registers.
  auto cc = ct::token_range(7000, 40);
  auto hc = ct::hashes_of(cc);
  EXPECT_EQ(r.match("C", cc).first, 0u);
  ASSERT_KVT_OK(r.alloc("C", {20, 21, 22}, 0));
  ASSERT_KVT_OK(ct::worker_step(r.c, r.g1, r.meta({{"C", 0, 40}}), {{20, hc[0]}, {21, hc[1]}}));
  ASSERT_KVT_OK(kvt_manager_reset(r.m.get(), KVT_TIER_G2));
  auto mine = store(r.m.get(), {hc[0]}, KVT_TIER_G2);
  ct::Finished g;
  uint64_t stored = r.stats().stored_blocks, failed = r.stats().store_failures;
  EXPECT_TRUE(ct::drain(r.c, r.c, &g, [&] {
    return r.stats().stored_blocks + r.stats().store_failures == stored + failed + 2;
  }));
  ASSERT_KVT_OK(kvt_connector_clear_connector_metadata(r.c));
  EXPECT_EQ(r.held(hc), 2u);
  ASSERT_KVT_OK(kvt_block_release(r.m.get(), mine.data(), 1));
  EXPECT_EQ(r.finish("C"), 0);
  kvt_tier_stats g2 = stats(r.m.get(), KVT_TIER_G2);
  EXPECT_EQ(g2.active, 0u);
  EXPECT_EQ(g2.registered, 2u);
  EXPECT_EQ(g2.free + g2.inactive, g2.capacity);
  EXPECT_KVT(kvt_manager_check(r.m.get()), KVT_OK);
}
