// The two ways G3 reaches the kernel: io_uring, or threads doing preadv/pwritev. Both take
// batches from several threads at once and hold a lock only to take or hand back work, so
// that concurrent transfers' I/O overlaps.
#pragma once

#include <sys/types.h>
#include <sys/uio.h>

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

struct io_uring;

namespace kvt {

// One vectored read or write at an offset; result: bytes moved, or -errno.
struct IoRequest {
  bool write = false;
  off_t offset = 0;  // -1: the file's own position (a pipe, in the tests)
  iovec iov[2] = {};
  ssize_t result = 0;
};

// io_uring, one ring per caller at a time: a caller takes a free ring (or sets up a new
// one, up to max_rings), submits and reaps its whole batch on it without a lock, and hands
// it back.
class RingPool {
 public:
  // Sets up the first ring; returns 0, or -errno when the kernel refuses io_uring.
  static int create(std::unique_ptr<RingPool> *out, unsigned max_rings);
  ~RingPool();
  void run(int fd, IoRequest *r, size_t n);

 private:
  struct RingDeleter {
    void operator()(io_uring *r) const noexcept;
  };
  using Ring = std::unique_ptr<io_uring, RingDeleter>;
  static Ring make(int *err);
  explicit RingPool(unsigned max_rings) : max_(max_rings) {}
  Ring take();
  void give(Ring r);
  void retire(Ring r);  // a ring left unusable: destroyed, so that a new one may be made

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Ring> free_;  // under mu_
  unsigned made_ = 0;       // rings in existence, under mu_
  unsigned max_;            // lowered to made_ when the kernel refuses another ring
};

// Threads that run preadv/pwritev. A caller queues its batch, takes part in it, and waits
// for it; the threads take one request at a time from the oldest batch with some left.
class IoThreads {
 public:
  explicit IoThreads(unsigned threads);  // beyond the callers; 0 runs each batch inline
  ~IoThreads();
  IoThreads(const IoThreads &) = delete;
  IoThreads &operator=(const IoThreads &) = delete;
  void run(int fd, IoRequest *r, size_t n);

 private:
  struct Batch {
    int fd;
    IoRequest *r;
    size_t n;
    size_t next = 0;  // first request nobody took, under mu_
    size_t done = 0;  // requests finished, under mu_
  };
  static void perform(int fd, IoRequest &r);
  void work();

  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  std::deque<Batch *> queue_;  // batches with requests left to take, under mu_
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace kvt
