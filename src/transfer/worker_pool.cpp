#include "transfer/worker_pool.hpp"

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
  for (size_t i; (i = j.next.fetch_add(1)) < j.n; ++done) (*j.fn)(i);
  return done;
}

void WorkerPool::work() {
  std::unique_lock lock(mu_);
  uint64_t seen = 0;
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || (job_ != nullptr && job_gen_ != seen); });
    if (stop_) return;
    Job &j = *job_;
    seen = job_gen_;
    ++j.joined;
    lock.unlock();
    size_t done = run(j);
    lock.lock();
    j.finished += done;
    --j.joined;
    if (j.finished == j.n && j.joined == 0) done_cv_.notify_all();
  }
}

void WorkerPool::parallel_for(size_t n, const std::function<void(size_t)> &fn) {
  if (n == 0) return;
  if (workers_.empty() || n == 1) {
    for (size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::lock_guard submit(submit_mu_);
  Job j;
  j.fn = &fn;
  j.n = n;
  {
    std::lock_guard lock(mu_);
    job_ = &j;
    ++job_gen_;
  }
  cv_.notify_all();
  size_t done = run(j);
  std::unique_lock lock(mu_);
  j.finished += done;
  // Wait until every index ran and no worker is still inside the job, then withdraw it.
  done_cv_.wait(lock, [&] { return j.finished == j.n && j.joined == 0; });
  job_ = nullptr;
}

}  // namespace kvt
