// Transfer and fence handles under hostile use: a release while another thread waits (parked
// on a fence, batched, or in flight), double release and destroy, stale, forged and foreign
// handles, handles of a destroyed manager, and the message of a timed-out wait.
#include <atomic>
#include <future>
#include <set>

#include "test_xfer_support.hpp"

using namespace kvt_xfer_test;

namespace {

// Waits on x from another thread; the future holds the status the wait returned. Returns
// once the thread is about to call kvt_xfer_wait, and a moment later.
std::future<kvt_status> wait_in_thread(kvt_xfer *x) {
  std::promise<kvt_status> p;
  auto f = p.get_future();
  auto calling = std::make_shared<std::atomic<bool>>(false);
  std::thread([x, calling, p = std::move(p)]() mutable {
    *calling = true;
    p.set_value(kvt_xfer_wait(x, -1));
  }).detach();
  while (!*calling) std::this_thread::yield();
  std::this_thread::sleep_for(5ms);
  return f;
}

kvt_status await(std::future<kvt_status> &f) {
  if (f.wait_for(20s) != std::future_status::ready) {
    ADD_FAILURE() << "the waiter did not return";
    std::abort();  // the detached waiter would outlive the test
  }
  return f.get();
}

}  // namespace

TEST(Threads, ReleaseWhileAnotherThreadWaitsOnAParkedTransfer) {
  TempDir dir;
  auto m = make(xfer_config(dir, 8, 8, 0));
  auto g1 = filled(m.get(), {1, 2});
  kvt_fence *f = nullptr;
  ASSERT_KVT_OK(kvt_fence_create(&f, m.get()));
  kvt_xfer *x = nullptr;
  ASSERT_KVT_OK(kvt_xfer_offload(&x, m.get(), g1.data(), 2, KVT_TIER_G2, f, 0));
  for (int i = 0; i < 1000 && state_of_xfer(x) != KVT_XFER_WAITING; ++i)
    std::this_thread::sleep_for(1ms);
  ASSERT_EQ(state_of_xfer(x), uint32_t(KVT_XFER_WAITING));
  auto waited = wait_in_thread(x);
  kvt_xfer_release(x);
  EXPECT_EQ(await(waited), KVT_ERR_CANCELLED);
  kvt_fence_destroy(f);
  ASSERT_KVT_OK(kvt_block_release(m.get(), g1.data(), 2));
  expect_all_returned(m.get());
}

TEST(Threads, ReleaseWhileAnotherThreadWaitsOnABatchedTransfer) {
  TempDir dir;
  kvt_manager_config c = xfer_config(dir, 8, 8, 0);
  c.min_batch_size = c.max_batch_size;  // never enough blocks
  c.flush_interval_us = 60'000'000;     // and a minute before a flush
  auto m = make(c);
  auto g1 = filled(m.get(), {1, 2});
  kvt_xfer *x = nullptr;
  ASSERT_KVT_OK(kvt_xfer_offload(&x, m.get(), g1.data(), 2, KVT_TIER_G2, nullptr, 0));
  for (int i = 0; i < 1000 && state_of_xfer(x) != KVT_XFER_BATCHED; ++i)
    std::this_thread::sleep_for(1ms);
  ASSERT_EQ(state_of_xfer(x), uint32_t(KVT_XFER_BATCHED));
  auto waited = wait_in_thread(x);
  kvt_xfer_release(x);
  EXPECT_EQ(await(waited), KVT_ERR_CANCELLED);
  EXPECT_EQ(matched(m.get(), KVT_TIER_G2, {1}), 0u) << "a released transfer was copied";
  ASSERT_KVT_OK(kvt_block_release(m.get(), g1.data(), 2));
  expect_all_returned(m.get());
}

// In flight, a release does not stop the copy: the waiter gets its final status.
TEST(Threads, ReleaseWhileAnotherThreadWaitsOnATransferInFlight) {
  TempDir dir;
  const size_t n = 2048;
  kvt_manager_config c = xfer_config(dir, n, 8, n);
  c.max_batch_size = 16;  // many batches: a long time in flight
  auto m = make(c);
  std::vector<uint64_t> h(n);
  for (size_t i = 0; i < n; ++i) h[i] = 1000 + i;
  auto g1 = filled(m.get(), h);
  int caught = 0;
  for (int round = 0; round < 10 && caught < 2; ++round) {
    kvt_xfer *x = nullptr;
    ASSERT_KVT_OK(kvt_xfer_offload(&x, m.get(), g1.data(), n, KVT_TIER_G3, nullptr, 0));
    auto waited = wait_in_thread(x);
    uint32_t st = 0;
    while ((st = state_of_xfer(x)) < KVT_XFER_INFLIGHT) std::this_thread::yield();
    kvt_xfer_release(x);
    kvt_status got = await(waited);  // once the copy has ended, if it had committed
    if (st == KVT_XFER_INFLIGHT) {
      ++caught;
      EXPECT_EQ(got, KVT_OK) << "released in flight: the copy finishes";
    } else {
      EXPECT_EQ(got, KVT_OK) << "it ended before the release";
    }
    // Make room for the next round.
    kvt_tier_stats g3 = stats(m.get(), KVT_TIER_G3);
    auto all = alloc(m.get(), g3.free + g3.inactive, KVT_TIER_G3);
    ASSERT_KVT_OK(kvt_block_release(m.get(), all.data(), all.size()));
    EXPECT_KVT(kvt_manager_check(m.get()), KVT_OK);
  }
  EXPECT_GT(caught, 0) << "no round was released while in flight";
  ASSERT_KVT_OK(kvt_block_release(m.get(), g1.data(), n));
  expect_all_returned(m.get());
}

TEST(Threads, ConcurrentReleasesAndCallsOnOneTransferAreSafe) {
  TempDir dir;
  auto m = make(xfer_config(dir, 8, 8, 0));
  auto g1 = filled(m.get(), {1});
  for (int round = 0; round < 50; ++round) {
    kvt_fence *f = nullptr;
    ASSERT_KVT_OK(kvt_fence_create(&f, m.get()));
    kvt_xfer *x = nullptr;
    ASSERT_KVT_OK(kvt_xfer_offload(&x, m.get(), g1.data(), 1, KVT_TIER_G2, f, 0));
    std::atomic<bool> go{false};
    std::vector<std::thread> ts;
    for (int t = 0; t < 4; ++t)
      ts.emplace_back([&, t] {
        while (!go) std::this_thread::yield();
        if (t == 0) kvt_xfer_release(x);
        if (t == 1) kvt_xfer_release(x);
        if (t == 2) kvt_xfer_cancel(x);
        if (t == 3) kvt_fence_destroy(f);
        kvt_xfer_status(nullptr, nullptr, nullptr, x);
        kvt_xfer_wait(x, 0);
        kvt_fence_signal(f);
        kvt_fence_destroy(f);
      });
    go = true;
    for (auto &t : ts) t.join();
    EXPECT_KVT(kvt_xfer_wait(x, 0), KVT_ERR_INVALID_HANDLE);
  }
  ASSERT_KVT_OK(kvt_block_release(m.get(), g1.data(), 1));
  expect_all_returned(m.get());
}

TEST(XferHandles, DoubleReleaseStaleForgedAndForeignHandlesAreRefused) {
  TempDir dir;
  auto m = make(xfer_config(dir, 8, 8, 0));
  auto other = make(xfer_config(dir, 8, 8, 0));
  auto g1 = filled(m.get(), {1});
  kvt_xfer *x = nullptr;
  ASSERT_KVT_OK(kvt_xfer_offload(&x, m.get(), g1.data(), 1, KVT_TIER_G2, nullptr, 0));
  ASSERT_KVT_OK(finish(x));
  kvt_xfer_release(x);
  kvt_xfer_release(x);  // ignored
  EXPECT_KVT(kvt_xfer_wait(x, 0), KVT_ERR_INVALID_HANDLE);
  EXPECT_KVT(kvt_xfer_status(nullptr, nullptr, nullptr, x), KVT_ERR_INVALID_HANDLE);
  EXPECT_KVT(kvt_xfer_cancel(x), KVT_ERR_INVALID_HANDLE);
  kvt_block out = 0;
  EXPECT_KVT(kvt_xfer_blocks(&out, 1, x), KVT_ERR_INVALID_HANDLE);

  kvt_fence *f = nullptr;
  ASSERT_KVT_OK(kvt_fence_create(&f, m.get()));
  kvt_fence_destroy(f);
  kvt_fence_destroy(f);  // ignored
  EXPECT_KVT(kvt_fence_signal(f), KVT_ERR_INVALID_HANDLE);
  kvt_xfer *y = nullptr;
  EXPECT_KVT(kvt_xfer_offload(&y, m.get(), g1.data(), 1, KVT_TIER_G2, f, 0),
             KVT_ERR_INVALID_HANDLE);

  // Forged: an address of live memory, a block handle, another object type.
  uint64_t local[8] = {};
  EXPECT_KVT(kvt_xfer_wait(reinterpret_cast<kvt_xfer *>(local), 0), KVT_ERR_INVALID_HANDLE);
  EXPECT_KVT(kvt_xfer_cancel(reinterpret_cast<kvt_xfer *>(uintptr_t(g1[0]))),
             KVT_ERR_INVALID_HANDLE);
  EXPECT_KVT(kvt_fence_signal(reinterpret_cast<kvt_fence *>(m.get())), KVT_ERR_INVALID_HANDLE);
  kvt_xfer_release(reinterpret_cast<kvt_xfer *>(local));
  kvt_fence_destroy(reinterpret_cast<kvt_fence *>(local));
  // A fence token is not a transfer, and the reverse.
  ASSERT_KVT_OK(kvt_fence_create(&f, m.get()));
  EXPECT_KVT(kvt_xfer_wait(reinterpret_cast<kvt_xfer *>(f), 0), KVT_ERR_INVALID_HANDLE);
  // A fence of another manager.
  kvt_fence *foreign = nullptr;
  ASSERT_KVT_OK(kvt_fence_create(&foreign, other.get()));
  EXPECT_KVT(kvt_xfer_offload(&y, m.get(), g1.data(), 1, KVT_TIER_G2, foreign, 0),
             KVT_ERR_INVALID_HANDLE);
  kvt_fence_destroy(foreign);
  kvt_fence_destroy(f);
  ASSERT_KVT_OK(kvt_block_release(m.get(), g1.data(), 1));
  expect_all_returned(m.get());
}

TEST(XferHandles, TokensAreNeverReused) {
  TempDir dir;
  auto m = make(xfer_config(dir, 8, 8, 0));
  std::set<uintptr_t> seen;
  for (int i = 0; i < 2000; ++i) {
    kvt_xfer *x = nullptr;
    ASSERT_KVT_OK(kvt_xfer_offload(&x, m.get(), nullptr, 0, KVT_TIER_G2, nullptr, 0));
    kvt_fence *f = nullptr;
    ASSERT_KVT_OK(kvt_fence_create(&f, m.get()));
    EXPECT_TRUE(seen.insert(uintptr_t(x)).second);
    EXPECT_TRUE(seen.insert(uintptr_t(f)).second);
    kvt_xfer_release(x);
    kvt_fence_destroy(f);
  }
  for (uintptr_t v : {*seen.begin(), *seen.rbegin()})
    EXPECT_KVT(kvt_xfer_wait(reinterpret_cast<kvt_xfer *>(v), 0), KVT_ERR_INVALID_HANDLE);
}

TEST(XferHandles, HandlesOfADestroyedManagerAreRefused) {
  TempDir dir;
  kvt_manager *m = nullptr;
  kvt_manager_config c = xfer_config(dir, 8, 8, 0);
  ASSERT_KVT_OK(kvt_manager_create(&m, &c));
  auto g1 = filled(m, {1});
  kvt_fence *f = nullptr;
  ASSERT_KVT_OK(kvt_fence_create(&f, m));
  kvt_xfer *x = nullptr;
  ASSERT_KVT_OK(kvt_xfer_offload(&x, m, g1.data(), 1, KVT_TIER_G2, f, 0));
  kvt_manager_destroy(m);
  EXPECT_KVT(kvt_xfer_wait(x, 0), KVT_ERR_INVALID_HANDLE);
  EXPECT_KVT(kvt_fence_signal(f), KVT_ERR_INVALID_HANDLE);
  kvt_xfer_release(x);
  kvt_fence_destroy(f);
}

TEST(XferHandles, TimeoutSetsItsOwnMessageAndEventsCarryTheToken) {
  TempDir dir;
  auto m = make(xfer_config(dir, 8, 8, 0));
  auto g1 = filled(m.get(), {1});
  kvt_fence *f = nullptr;
  ASSERT_KVT_OK(kvt_fence_create(&f, m.get()));
  kvt_xfer *x = nullptr;
  ASSERT_KVT_OK(kvt_xfer_offload(&x, m.get(), g1.data(), 1, KVT_TIER_G2, f, 42));
  std::vector<kvt_block> big(100000);
  EXPECT_NE(kvt_block_alloc(big.data(), big.size(), m.get(), KVT_TIER_G1), KVT_OK);  // a message
  EXPECT_KVT(kvt_xfer_wait(x, 1000), KVT_TIMEOUT);
  EXPECT_EQ(std::string(kvt_last_error()),
            "kvt_xfer_wait: the transfer did not end within 1000 ns");
  EXPECT_KVT(kvt_xfer_wait(x, 0), KVT_TIMEOUT);
  EXPECT_EQ(std::string(kvt_last_error()), "kvt_xfer_wait: the transfer did not end within 0 ns");
  ASSERT_KVT_OK(kvt_fence_signal(f));
  ASSERT_KVT_OK(finish(x));
  auto ev = drain(m.get());
  size_t done = 0;
  for (auto &e : ev)
    if (e.type == KVT_EVENT_XFER_DONE) {
      ++done;
      EXPECT_EQ(e.xfer, x);
      EXPECT_EQ(e.user_data, 42u);
      ASSERT_KVT_OK(kvt_xfer_status(nullptr, nullptr, nullptr, e.xfer));
    }
  EXPECT_EQ(done, 1u);
  kvt_xfer_release(x);
  kvt_fence_destroy(f);
  ASSERT_KVT_OK(kvt_block_release(m.get(), g1.data(), 1));
  expect_all_returned(m.get());
}
