#include "copy/worker_pool.hpp"

#include <algorithm>

namespace kvt {

WorkerPool::WorkerPool(unsigned threads) {
  for (unsigned i = 0; i < threads; ++i) workers_.emplace_back([this] { work(); });
}

WorkerPool::~WorkerPool() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto &t : workers_) t.join();
}

size_t WorkerPool::run(Job &j) {
  size_t done = 0;
  for (size_t i; (i = j.next.fetch_add(1, std::memory_order_relaxed)) < j.n; ++done) (*j.fn)(i);
  return done;
}

void WorkerPool::withdraw_locked(Job *j) {
  auto it = std::find(jobs_.begin(), jobs_.end(), j);
  if (it != jobs_.end()) jobs_.erase(it);
}

void WorkerPool::work() {
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
    if (stop_) return;
    Job *j = jobs_[turn_++ % jobs_.size()];
    if (j->next.load(std::memory_order_relaxed) >= j->n) {
      withdraw_locked(j);  // every index is taken: nobody needs to join it any more
      continue;
    }
    ++j->joined;
    lock.unlock();
    size_t done = run(*j);
    lock.lock();
    withdraw_locked(j);  // run() returned, so every index is taken
    j->finished += done;
    --j->joined;
    if (j->finished == j->n && j->joined == 0) done_cv_.notify_all();
  }
}

void WorkerPool::parallel_for(size_t n, const std::function<void(size_t)> &fn) {
  if (n == 0) return;
  if (workers_.empty() || n == 1) {
    for (size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  Job j;
  j.fn = &fn;
  j.n = n;
  {
    std::lock_guard lock(mu_);
    jobs_.push_back(&j);
  }
  // Wake as many workers as there are indices beyond the caller's own.
  if (n - 1 >= workers_.size()) cv_.notify_all();
  else for (size_t k = 0; k < n - 1; ++k) cv_.notify_one();
  size_t done = run(j);
  std::unique_lock lock(mu_);
  withdraw_locked(&j);  // no worker joins it from here on
  j.finished += done;
  // Wait until every index ran and no worker is still inside the job: it lives on this stack.
  done_cv_.wait(lock, [&] { return j.finished == j.n && j.joined == 0; });
}

}  // namespace kvt
