// The worker pool runs several callers' jobs at once (max_concurrent_transfers > 1 copies in
// parallel), and every index of every job runs exactly once. Also run under TSan.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "transfer/worker_pool.hpp"

namespace {

// Each job's first index waits until the other job has started one of its own. A pool that
// runs one job at a time never lets the second start, so the wait times out.
TEST(Threads, WorkerPoolRunsTwoCallersJobsAtOnce) {
  kvt::WorkerPool pool(1);
  std::mutex mu;
  std::condition_variable cv;
  bool started[2] = {false, false};
  bool saw_other[2] = {false, false};
  auto caller = [&](int me) {
    pool.parallel_for(2, [&](size_t i) {
      if (i != 0) return;
      std::unique_lock lock(mu);
      started[me] = true;
      cv.notify_all();
      saw_other[me] = cv.wait_for(lock, std::chrono::seconds(10), [&] { return started[1 - me]; });
    });
  };
  std::thread a(caller, 0), b(caller, 1);
  a.join();
  b.join();
  EXPECT_TRUE(saw_other[0]);
  EXPECT_TRUE(saw_other[1]);
}

TEST(Threads, WorkerPoolManyCallersRunEveryIndexOnce) {
  kvt::WorkerPool pool(3);
  std::atomic<int> bad{0};
  auto caller = [&](int id) {
    std::mt19937 rng(id);
    for (int iter = 0; iter < 300; ++iter) {
      size_t n = 1 + rng() % 17;
      std::vector<std::atomic<int>> ran(n);
      pool.parallel_for(n, [&](size_t i) { ran[i].fetch_add(1); });
      for (auto &r : ran) bad += r.load() != 1;
    }
  };
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t) ts.emplace_back(caller, t);
  for (auto &t : ts) t.join();
  EXPECT_EQ(bad.load(), 0);
}

}  // namespace
