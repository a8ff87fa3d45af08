// The names 0.5.0 replaced (kvtier.h, "Deprecated names") still work, each as its new name
// or, where 0.5.0 changed an order or a code, with its old count and code: programs built
// against 0.4.0 call them.
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "connector_support.hpp"
#include "support.hpp"

#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

namespace {

using namespace kvt_test;
using namespace kvt_conn_test;

// The XFER_DONE of the transfer with this user_data, waited for through the old kvt_poll.
kvt_status done_status(kvt_manager *m, kvt_xfer *x, uint64_t user_data) {
  EXPECT_EQ(kvt_xfer_wait(x, -1), KVT_OK) << kvt_last_error();
  kvt_event ev[16];
  for (size_t n; (n = kvt_poll(m, ev, 16)) > 0;)
    for (size_t i = 0; i < n; ++i)
      if (ev[i].type == KVT_EVENT_XFER_DONE && ev[i].user_data == user_data) return ev[i].status;
  return KVT_ERR_NOT_FOUND;
}

TEST(DeprecatedNames, TransfersMatchesAndEventsByTheirOldNames) {
  auto m = make(small_config(8, 8));
  ASSERT_TRUE(m);
  const std::vector<uint64_t> h = {0x1111, 0x2222};
  std::vector<kvt_block> g1 = store(m.get(), h);
  EXPECT_EQ(kvt_event_fd(m.get()), kvt_manager_event_fd(m.get()));
  EXPECT_GE(kvt_event_fd(m.get()), 0);

  kvt_xfer *x = nullptr;
  ASSERT_KVT_OK(kvt_offload(&x, m.get(), g1.data(), g1.size(), KVT_TIER_G2, nullptr, 7));
  EXPECT_EQ(done_status(m.get(), x, 7), KVT_OK);
  kvt_xfer_release(x);
  size_t n = 0;
  kvt_block got[2] = {0, 0};
  ASSERT_KVT_OK(kvt_match_prefix(&n, got, m.get(), KVT_TIER_G2, h.data(), h.size()));
  EXPECT_EQ(n, 2u) << "kvt_offload's copy is not in G2";

  std::vector<kvt_block> dst = alloc(m.get(), 2);
  ASSERT_KVT_OK(kvt_onboard(&x, m.get(), got, dst.data(), 2, nullptr, 8));
  EXPECT_EQ(done_status(m.get(), x, 8), KVT_OK);
  kvt_xfer_release(x);
  EXPECT_EQ(stats(m.get(), KVT_TIER_G1).registered, 2u);

  // Refused as the new name refuses, and the message names the call that ran.
  EXPECT_KVT(kvt_offload(nullptr, m.get(), g1.data(), 1, KVT_TIER_G2, nullptr, 0),
             KVT_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kvt_last_error()).find("kvt_xfer_offload"), std::string::npos)
      << kvt_last_error();
  EXPECT_KVT(kvt_match_prefix(&n, got, m.get(), KVT_TIER_G4, h.data(), 1),
             KVT_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(kvt_poll(nullptr, nullptr, 0), 0u);
  EXPECT_EQ(kvt_event_fd(nullptr), -1);
  kvt_block_release(m.get(), got, 2);
  kvt_block_release(m.get(), g1.data(), g1.size());
  kvt_block_release(m.get(), dst.data(), dst.size());
}

TEST(DeprecatedNames, SubscriptionAndRecorderByTheirOldNames) {
  auto m = make(small_config(8, 8));
  ASSERT_TRUE(m);
  TempDir dir;
  const std::string dumped = dir.path + "/ring.log", logged = dir.path + "/open.log";
  kvt_subscription *s = nullptr;
  ASSERT_KVT_OK(kvt_subscribe(&s, m.get(), 64));
  ASSERT_KVT_OK(kvt_recorder_ring(m.get(), 64));
  ASSERT_KVT_OK(kvt_recorder_open(m.get(), logged.c_str()));
  EXPECT_KVT(kvt_recorder_open(m.get(), logged.c_str()), KVT_ERR_STATE);
  std::vector<kvt_block> g1 = store(m.get(), {0x3333});
  ASSERT_KVT_OK(kvt_recorder_close(m.get()));
  ASSERT_KVT_OK(kvt_recorder_dump(m.get(), dumped.c_str()));

  kvt_obs_event ev[64];
  const size_t got = kvt_subscription_drain(s, ev, 64);
  EXPECT_GE(got, 1u) << "kvt_subscribe's reader saw nothing";
  kvt_subscription_destroy(s);
  for (const std::string &path : {dumped, logged}) {
    kvt_event_log *l = nullptr;
    ASSERT_KVT_OK(kvt_event_log_open(&l, path.c_str()));
    size_t stored = 0;
    kvt_obs_event e;
    kvt_status end;
    while ((end = kvt_event_log_next(l, &e)) == KVT_OK) stored += e.kind == KVT_OBS_BLOCK_STORED;
    EXPECT_EQ(end, KVT_ERR_NOT_FOUND) << "the old end of a log";
    EXPECT_EQ(kvt_event_log_read(&e, l), KVT_ITEROVER) << "the new one";
    kvt_event_log_close(l);
    EXPECT_EQ(stored, 1u) << path;
  }
  EXPECT_KVT(kvt_subscribe(&s, nullptr, 64), KVT_ERR_INVALID_ARGUMENT);
  kvt_block_release(m.get(), g1.data(), g1.size());
}

TEST(DeprecatedNames, BreakpointsByTheirOldNames) {
  Rig r;
  ASSERT_NE(r.c, nullptr);
  uint64_t id = 0;
  ASSERT_KVT_OK(kvt_breakpoint_add(&id, r.c, KVT_SLOT_DECODING, nullptr));
  EXPECT_NE(id, 0u);
  ASSERT_KVT_OK(kvt_breakpoint_remove(r.c, id));
  EXPECT_KVT(kvt_breakpoint_remove(r.c, id), KVT_ERR_NOT_FOUND);
  EXPECT_KVT(kvt_breakpoint_add(&id, r.c, 99, nullptr), KVT_ERR_INVALID_ARGUMENT);
}

// The forms 0.5.0 gave a conforming order or code keep their old counts and codes.
TEST(DeprecatedNames, ArraysByTheirOldOrderKeepTheirOldCounts) {
  auto m = make(small_config(6, 0));
  ASSERT_TRUE(m);
  std::vector<kvt_block> a = store(m.get(), {11, 12, 13});
  ASSERT_KVT_OK(kvt_block_release(m.get(), a.data(), a.size()));
  kvt_block out[8] = {};
  size_t n = 99;
  ASSERT_KVT_OK(kvt_tier_evictable(&n, out, 2, m.get(), KVT_TIER_G1));
  EXPECT_EQ(n, 2u) << "how many were written, not how many there are";
  EXPECT_EQ(out[0], a[2]);
  EXPECT_EQ(out[1], a[1]);
  EXPECT_KVT(kvt_tier_evictable(nullptr, out, 2, m.get(), KVT_TIER_G1),
             KVT_ERR_INVALID_ARGUMENT);

  std::vector<uint32_t> t(64, 3);
  uint64_t h[4] = {}, want[4] = {};
  ASSERT_KVT_OK(kvt_hash_tokens(want, 4, &n, 0, t.data(), t.size(), 16));
  n = 0;
  EXPECT_KVT(kvt_hash_sequence(h, &n, 2, 0, t.data(), t.size(), 16), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(n, 4u);
  EXPECT_EQ(h[0], 0u) << "a refused call writes nothing";
  ASSERT_KVT_OK(kvt_hash_sequence(nullptr, &n, 0, 0, t.data(), t.size(), 16));
  EXPECT_EQ(n, 4u);
  ASSERT_KVT_OK(kvt_hash_sequence(h, &n, 4, 0, t.data(), t.size(), 16));
  EXPECT_EQ(n, 4u);
  EXPECT_TRUE(std::equal(h, h + 4, want));

  kvt_seq *s = nullptr;
  ASSERT_KVT_OK(kvt_seq_create(&s, 0, 16));
  ASSERT_KVT_OK(kvt_seq_append(s, t.data(), t.size()));
  uint64_t seq[4] = {};
  ASSERT_KVT_OK(kvt_seq_hashes(&n, nullptr, seq, s, 1, 2));
  EXPECT_EQ(n, 2u) << "how many were copied, not how many are complete";
  EXPECT_EQ(seq[0], want[1]);
  EXPECT_EQ(seq[1], want[2]);
  kvt_seq_destroy(s);
}

TEST(DeprecatedNames, ConnectorEventsAndPauseByTheirOldNames) {
  Rig r;
  ASSERT_NE(r.c, nullptr);
  EXPECT_EQ(kvt_connector_take_events(nullptr, 4, r.c), 0u);
  kvt_event ev[4];
  EXPECT_EQ(kvt_connector_take_events(ev, 4, nullptr), 0u);
  kvt_pause_info info{};
  info.struct_size = sizeof info;
  EXPECT_KVT(kvt_connector_wait_paused(&info, r.c, 1), KVT_AGAIN);  // the old code of a wait
  EXPECT_KVT(kvt_connector_pause_wait(&info, r.c, 1'000'000), KVT_TIMEOUT);

  // A wait without a deadline (timeout_ns < 0) returns once a call pauses.
  ASSERT_KVT_OK(kvt_connector_pause(r.c));
  kvt_status st = KVT_ERR_INTERNAL;
  std::thread t([&] { st = kvt_connector_reset_cache(r.c); });
  EXPECT_KVT(kvt_connector_pause_wait(&info, r.c, -1), KVT_OK);
  EXPECT_EQ(info.trigger, uint32_t(KVT_TRIGGER_RESET_CACHE));
  EXPECT_KVT(kvt_connector_wait_paused(&info, r.c, 1000), KVT_OK);
  EXPECT_KVT(kvt_connector_resume(r.c), KVT_OK);
  t.join();
  EXPECT_KVT(st, KVT_OK);
  EXPECT_STREQ(kvt_status_str(KVT_ITEROVER), "KVT_ITEROVER");
}

}  // namespace
