// A fixed pool of threads that runs index ranges in parallel, with the calling thread
// taking part. Used to split large host copies and, without io_uring, disk I/O.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kvt {

class WorkerPool {
 public:
  explicit WorkerPool(unsigned threads);  // threads beyond the caller; 0 runs inline
  ~WorkerPool();
  WorkerPool(const WorkerPool &) = delete;
  WorkerPool &operator=(const WorkerPool &) = delete;

  // Runs fn(i) for every i in [0, n) and returns when all have run. Calls from several
  // threads run at the same time: each caller works on its own job, and the workers spread
  // over the jobs posted.
  void parallel_for(size_t n, const std::function<void(size_t)> &fn);
  unsigned threads() const noexcept { return unsigned(workers_.size()); }

 private:
  // One parallel_for call, on its caller's stack. Indices are claimed through `next`
  // without the lock; mu_ guards only the bookkeeping of who is inside.
  struct Job {
    const std::function<void(size_t)> *fn;
    size_t n;
    std::atomic<size_t> next{0};
    size_t finished = 0;  // indices run, under mu_
    unsigned joined = 0;  // workers inside the job, under mu_
  };
  void work();
  static size_t run(Job &j);
  void withdraw_locked(Job *j);

  std::mutex mu_;  // held only to post, take or finish a job, never during fn
  std::condition_variable cv_, done_cv_;
  std::vector<Job *> jobs_;  // posted jobs with indices left, under mu_
  size_t turn_ = 0;          // which job the next worker joins, round robin, under mu_
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace kvt
