// Block handles never come back: not after a slot's millionth reuse, not in another manager,
// and not after their manager is gone; and the process-wide bound on live managers.
#include <atomic>
#include <barrier>
#include <cstring>
#include <deque>
#include <thread>

#include "support.hpp"

using namespace kvt_test;

namespace {

kvt_manager_config one_block_config() {
  kvt_manager_config c = small_config(1, 0);
  c.copy_threads = 1;  // no copy threads: these tests create managers by the thousand
  return c;
}

// The block b still holds exactly the caller's reference and the manager is consistent.
void expect_owned(kvt_manager *m, kvt_block b) {
  kvt_block_info i{};
  i.struct_size = sizeof i;
  ASSERT_KVT_OK(kvt_block_info_get(&i, m, b));
  EXPECT_EQ(i.refs, 1u);
  EXPECT_EQ(i.state, uint32_t(KVT_BLOCK_EMPTY));
  EXPECT_KVT(kvt_manager_check(m), KVT_OK);
}

}  // namespace

// A hot slot reused past 2^20 times (the old generation's range): the first handle to it is
// still stale, and releasing it cannot free the new owner's block.
TEST(AbiHandles, StaleHandleStaysStaleAfterTwoToTheTwentyReuses) {
  auto m = make(one_block_config());
  kvt_block first = 0, b = 0;
  ASSERT_KVT_OK(kvt_block_alloc(&first, 1, m.get(), KVT_TIER_G1));
  ASSERT_KVT_OK(kvt_block_release(m.get(), &first, 1));
  // Each release moves the slot to its next generation; 2^20 - 1 more round trips bring the
  // next allocation to generation 2^20, which a 20-bit generation would have wrapped to 0.
  for (uint32_t i = 1; i < (1u << 20); ++i) {
    kvt_block_alloc(&b, 1, m.get(), KVT_TIER_G1);
    kvt_block_release(m.get(), &b, 1);
  }
  ASSERT_KVT_OK(kvt_block_alloc(&b, 1, m.get(), KVT_TIER_G1));
  EXPECT_NE(b, first);
  EXPECT_KVT(kvt_block_release(m.get(), &first, 1), KVT_ERR_INVALID_HANDLE);
  EXPECT_KVT(kvt_block_retain(m.get(), first), KVT_ERR_INVALID_HANDLE);
  expect_owned(m.get(), b);
  kvt_tier_stats s = stats(m.get(), KVT_TIER_G1);
  EXPECT_EQ(s.allocs, uint64_t{1} << 20 | 1);
  EXPECT_EQ(s.retired, 0u);
  ASSERT_KVT_OK(kvt_block_release(m.get(), &b, 1));
}

// One manager lives while 20,000 others come and go: none of them accepts its handle, and
// it accepts none of theirs, although every one of them hands out the same slot and
// generation.
TEST(AbiHandles, LiveManagersHandlesAreForeignToTwentyThousandNewOnes) {
  auto keeper = make(one_block_config());
  kvt_block kept = 0;
  ASSERT_KVT_OK(kvt_block_alloc(&kept, 1, keeper.get(), KVT_TIER_G1));
  const kvt_manager_config c = one_block_config();
  for (int i = 0; i < 20000; ++i) {
    kvt_manager *m = nullptr;
    ASSERT_KVT_OK(kvt_manager_create(&m, &c));
    kvt_block mine = 0;
    ASSERT_KVT_OK(kvt_block_alloc(&mine, 1, m, KVT_TIER_G1));
    ASSERT_EQ(kvt_block_release(m, &kept, 1), KVT_ERR_INVALID_HANDLE) << "manager " << i;
    ASSERT_EQ(kvt_block_release(keeper.get(), &mine, 1), KVT_ERR_INVALID_HANDLE);
    kvt_manager_destroy(m);
  }
  expect_owned(keeper.get(), kept);
  ASSERT_KVT_OK(kvt_block_release(keeper.get(), &kept, 1));
}

// A destroyed manager's number goes to the back of the queue: with one other manager alive,
// its handles stay foreign to the next 254 managers created (255 - 1 alive).
TEST(AbiHandles, DeadManagersHandlesAreForeignToTheManagersAfterIt) {
  auto keeper = make(one_block_config());
  const kvt_manager_config c = one_block_config();
  std::deque<kvt_block> dead;  // a handle of each of the last 254 destroyed managers
  for (int i = 0; i < 600; ++i) {
    kvt_manager *m = nullptr;
    ASSERT_KVT_OK(kvt_manager_create(&m, &c));
    for (kvt_block old : dead)  // forged by now: its manager is gone
      ASSERT_EQ(kvt_block_release(m, &old, 1), KVT_ERR_INVALID_HANDLE) << "manager " << i;
    kvt_block mine = 0;
    ASSERT_KVT_OK(kvt_block_alloc(&mine, 1, m, KVT_TIER_G1));
    kvt_manager_destroy(m);
    dead.push_back(mine);
    if (dead.size() > 254) dead.pop_front();
  }
}

// KVT_MAX_MANAGERS live at once; one more is refused with a message, and once one is
// destroyed, a new one can be created again.
TEST(AbiHandles, OneManagerMoreThanTheMostIsRefused) {
  const kvt_manager_config c = one_block_config();
  std::vector<ManagerPtr> live;
  for (int i = 0; i < KVT_MAX_MANAGERS; ++i) {
    kvt_manager *m = nullptr;
    ASSERT_KVT_OK(kvt_manager_create(&m, &c));
    live.emplace_back(m);
  }
  kvt_manager *extra = nullptr;
  EXPECT_KVT(kvt_manager_create(&extra, &c), KVT_ERR_NO_SPACE);
  EXPECT_EQ(extra, nullptr);
  EXPECT_NE(std::strstr(kvt_last_error(), "256 managers are alive"), nullptr) << kvt_last_error();
  // Every live manager still has its own number: each refuses the others' handles.
  std::vector<kvt_block> blocks(live.size());
  for (size_t i = 0; i < live.size(); ++i)
    ASSERT_KVT_OK(kvt_block_alloc(&blocks[i], 1, live[i].get(), KVT_TIER_G1));
  for (size_t i = 0; i < live.size(); ++i)
    ASSERT_EQ(kvt_block_retain(live[i].get(), blocks[(i + 1) % live.size()]),
              KVT_ERR_INVALID_HANDLE);
  live.pop_back();
  kvt_manager *m = nullptr;
  ASSERT_KVT_OK(kvt_manager_create(&m, &c));
  kvt_manager_destroy(m);
}

// Managers created and destroyed on four threads at once get distinct numbers: in every
// round, each of the four live managers refuses the other three's handles.
TEST(Threads, ManagersComingAndGoingOnFourThreadsRefuseEachOthersHandles) {
  constexpr int kThreads = 4, kRounds = 200;
  const kvt_manager_config c = one_block_config();
  kvt_block published[kThreads] = {};
  std::barrier sync(kThreads);
  std::vector<std::thread> threads;
  std::atomic<int> accepted{0}, failed{0};
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      for (int r = 0; r < kRounds; ++r) {
        kvt_manager *m = nullptr;
        if (kvt_manager_create(&m, &c) != KVT_OK ||
            kvt_block_alloc(&published[t], 1, m, KVT_TIER_G1) != KVT_OK)
          ++failed;
        sync.arrive_and_wait();  // all four live, each with one block
        for (int o = 0; o < kThreads; ++o)
          if (o != t && kvt_block_retain(m, published[o]) != KVT_ERR_INVALID_HANDLE) ++accepted;
        sync.arrive_and_wait();  // done looking before anyone destroys
        kvt_manager_destroy(m);
      }
    });
  for (auto &th : threads) th.join();
  EXPECT_EQ(failed.load(), 0);
  EXPECT_EQ(accepted.load(), 0);
}
