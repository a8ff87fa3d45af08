// Events: content and order, bounded queue with EVENTS_DROPPED, and the eventfd.
#include <poll.h>

#include "support.hpp"

using namespace kvt_test;

namespace {
bool fd_readable(int fd) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 0) == 1 && (p.revents & POLLIN);
}
}  // namespace

TEST(Events, StoredAndRemovedCarryTierHashAndParent) {
  auto m = make(small_config(2, 2));
  int fd = kvt_manager_event_fd(m.get());
  ASSERT_GE(fd, 0);
  EXPECT_FALSE(fd_readable(fd));
  auto a = store(m.get(), {10, 20});
  auto g2 = store(m.get(), {30}, KVT_TIER_G2);
  EXPECT_TRUE(fd_readable(fd));
  auto ev = drain(m.get());
  EXPECT_FALSE(fd_readable(fd));
  ASSERT_EQ(ev.size(), 3u);
  EXPECT_EQ(ev[0].type, uint32_t(KVT_EVENT_BLOCK_STORED));
  EXPECT_EQ(ev[0].tier, uint32_t(KVT_TIER_G1));
  EXPECT_EQ(ev[0].hash, 10u);
  EXPECT_EQ(ev[0].parent_hash, 0u);
  EXPECT_EQ(ev[1].hash, 20u);
  EXPECT_EQ(ev[1].parent_hash, 10u);
  EXPECT_EQ(ev[2].tier, uint32_t(KVT_TIER_G2));
  EXPECT_EQ(ev[2].hash, 30u);
  ASSERT_KVT_OK(kvt_block_release(m.get(), a.data(), 2));
  EXPECT_TRUE(drain(m.get()).empty());  // becoming inactive is not removal
  alloc(m.get(), 2);
  ev = drain(m.get());
  ASSERT_EQ(ev.size(), 2u);
  for (auto &e : ev) {
    EXPECT_EQ(e.type, uint32_t(KVT_EVENT_BLOCK_REMOVED));
    EXPECT_EQ(e.tier, uint32_t(KVT_TIER_G1));
  }
  EXPECT_EQ(ev[0].hash, 20u);
  EXPECT_EQ(ev[1].hash, 10u);
}

TEST(Events, PollInBatchesKeepsOrder) {
  auto m = make(small_config(64, 0));
  std::vector<uint64_t> hashes;
  for (uint64_t i = 1; i <= 50; ++i) hashes.push_back(i * 7);
  store(m.get(), hashes);
  kvt_event buf[8];
  std::vector<uint64_t> seen;
  size_t n;
  while ((n = kvt_manager_poll(m.get(), buf, 8)) > 0) {
    EXPECT_LE(n, 8u);
    for (size_t i = 0; i < n; ++i) seen.push_back(buf[i].hash);
  }
  EXPECT_EQ(seen, hashes);
  EXPECT_EQ(kvt_manager_poll(m.get(), buf, 8), 0u);
}

TEST(Events, OverflowDropsOldestAndReportsTheCount) {
  kvt_manager_config c = small_config(32, 0);
  c.event_capacity = 4;
  auto m = make(c);
  int fd = kvt_manager_event_fd(m.get());
  std::vector<uint64_t> hashes;
  for (uint64_t i = 1; i <= 10; ++i) hashes.push_back(i);
  store(m.get(), hashes);
  kvt_event buf[16];
  size_t n = kvt_manager_poll(m.get(), buf, 2);
  ASSERT_EQ(n, 2u);
  EXPECT_EQ(buf[0].type, uint32_t(KVT_EVENT_EVENTS_DROPPED));
  EXPECT_EQ(buf[0].count, 6u);
  EXPECT_EQ(buf[1].hash, 7u);  // the newest four survive: 7, 8, 9, 10
  EXPECT_TRUE(fd_readable(fd));
  n = kvt_manager_poll(m.get(), buf, 16);
  ASSERT_EQ(n, 3u);
  EXPECT_EQ(buf[0].hash, 8u);
  EXPECT_EQ(buf[2].hash, 10u);
  EXPECT_FALSE(fd_readable(fd));
  // The count restarts after it was reported.
  store(m.get(), {100, 101, 102, 103, 104});
  n = kvt_manager_poll(m.get(), buf, 16);
  ASSERT_EQ(n, 5u);
  EXPECT_EQ(buf[0].type, uint32_t(KVT_EVENT_EVENTS_DROPPED));
  EXPECT_EQ(buf[0].count, 1u);
  EXPECT_EQ(buf[1].hash, 101u);
}

TEST(Events, BadArgumentsGiveZeroAndAMessage) {
  auto m = make(small_config(2, 0));
  kvt_event e;
  EXPECT_EQ(kvt_manager_poll(nullptr, &e, 1), 0u);
  EXPECT_NE(std::string(kvt_last_error()).find("NULL"), std::string::npos);
  EXPECT_EQ(kvt_manager_poll(m.get(), nullptr, 4), 0u);
  EXPECT_NE(std::string(kvt_last_error()).find("out"), std::string::npos);
  EXPECT_EQ(kvt_manager_poll(m.get(), nullptr, 0), 0u);
  EXPECT_EQ(kvt_manager_event_fd(nullptr), -1);
}

TEST(Events, QueueGrowsToItsBoundInOrder) {
  kvt_manager_config c = small_config(4096, 0);
  c.event_capacity = 3000;  // beyond the queue's initial storage
  auto m = make(c);
  std::vector<uint64_t> hashes;
  for (uint64_t i = 1; i <= 3500; ++i) hashes.push_back(i);
  store(m.get(), hashes);
  auto ev = drain(m.get());
  ASSERT_EQ(ev.size(), 3001u);
  EXPECT_EQ(ev[0].type, uint32_t(KVT_EVENT_EVENTS_DROPPED));
  EXPECT_EQ(ev[0].count, 500u);
  for (size_t i = 1; i < ev.size(); ++i) ASSERT_EQ(ev[i].hash, 500 + i) << i;
}
