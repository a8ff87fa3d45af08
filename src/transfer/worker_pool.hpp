// A fixed pool of threads that runs index ranges in parallel, with the calling thread
// taking part. Used to split large host copies and, without io_uring, disk I/O.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
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
  // threads take turns.
  void parallel_for(size_t n, const std::function<void(size_t)> &fn);
  unsigned threads() const noexcept { return unsigned(workers_.size()); }

 private:
  struct Job {
    const std::function<void(size_t)> *fn;
    size_t n;
    std::atomic<size_t> next{0};
    size_t finished = 0;  // indices run, under mu_
    unsigned joined = 0;  // workers inside the job, under mu_
  };
  void work();
  static size_t run(Job &j);

  std::mutex submit_mu_;  // one job at a time
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  Job *job_ = nullptr;  // the job workers may join, under mu_
  uint64_t job_gen_ = 0;  // counts jobs, so that a worker joins each one once
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace kvt
