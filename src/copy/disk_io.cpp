#include "copy/disk_io.hpp"

#include <liburing.h>

#include <algorithm>
#include <cerrno>

namespace kvt {

namespace {
constexpr unsigned kRingDepth = 64;
}

void RingPool::RingDeleter::operator()(io_uring *r) const noexcept {
  io_uring_queue_exit(r);
  delete r;
}

RingPool::Ring RingPool::make(int *err) {
  auto *r = new io_uring;
  if (int e = io_uring_queue_init(kRingDepth, r, 0); e != 0) {
    delete r;
    *err = e;
    return nullptr;
  }
  return Ring(r);
}

int RingPool::create(std::unique_ptr<RingPool> *out, unsigned max_rings) {
  int err = 0;
  Ring first = make(&err);
  if (!first) return err;
  std::unique_ptr<RingPool> p(new RingPool(std::max(max_rings, 1u)));
  p->free_.push_back(std::move(first));
  p->made_ = 1;
  *out = std::move(p);
  return 0;
}

RingPool::~RingPool() = default;  // every ring is back: the callers have returned

RingPool::Ring RingPool::take() {
  std::unique_lock lock(mu_);
  for (;;) {
    if (!free_.empty()) {
      Ring r = std::move(free_.back());
      free_.pop_back();
      return r;
    }
    if (made_ < max_) {
      ++made_;
      lock.unlock();
      int err = 0;
      Ring r = make(&err);  // outside the lock: a system call
      if (r) return r;
      lock.lock();
      max_ = --made_;  // the kernel allows no more (locked memory): share those there are
      continue;
    }
    cv_.wait(lock, [&] { return !free_.empty(); });
  }
}

void RingPool::give(Ring r) {
  {
    std::lock_guard lock(mu_);
    free_.push_back(std::move(r));
  }
  cv_.notify_one();
}

void RingPool::retire(Ring r) {
  {
    std::lock_guard lock(mu_);
    --made_;
  }
  cv_.notify_one();  // a waiter may make the next ring
  r.reset();         // io_uring_queue_exit, outside the lock
}

void RingPool::run(int fd, IoRequest *req, size_t n) {
  Ring ring = take();
  size_t next = 0, inflight = 0;
  while (next < n || inflight > 0) {
    unsigned queued = 0;
    while (next < n && inflight + queued < kRingDepth) {
      io_uring_sqe *sqe = io_uring_get_sqe(ring.get());
      if (sqe == nullptr) break;
      IoRequest &x = req[next];
      if (x.write) io_uring_prep_writev(sqe, fd, x.iov, 2, x.offset);
      else io_uring_prep_readv(sqe, fd, x.iov, 2, x.offset);
      io_uring_sqe_set_data64(sqe, next);
      ++next;
      ++queued;
    }
    // Submits what was queued and waits for at least one completion.
    int r = io_uring_submit_and_wait(ring.get(), 1);
    if (r < 0 && r != -EINTR && r != -EAGAIN && r != -EBUSY) {
      // The kernel took none of the new entries, yet they stay in the ring's queue, where
      // the next submission would send them with this batch's buffers long gone. Fail them
      // and the rest, reap what is in flight without submitting, and retire the ring.
      for (size_t i = next - queued; i < n; ++i) req[i].result = r;
      for (io_uring_cqe *cqe = nullptr; inflight > 0 && io_uring_wait_cqe(ring.get(), &cqe) == 0;
           --inflight) {
        req[io_uring_cqe_get_data64(cqe)].result = cqe->res;
        io_uring_cqe_seen(ring.get(), cqe);
      }
      retire(std::move(ring));
      return;
    }
    inflight += queued;
    io_uring_cqe *cqe = nullptr;
    while (inflight > 0 && io_uring_peek_cqe(ring.get(), &cqe) == 0) {
      req[io_uring_cqe_get_data64(cqe)].result = cqe->res;
      io_uring_cqe_seen(ring.get(), cqe);
      --inflight;
    }
  }
  give(std::move(ring));
}

IoThreads::IoThreads(unsigned threads) {
  for (unsigned i = 0; i < threads; ++i) threads_.emplace_back([this] { work(); });
}

IoThreads::~IoThreads() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (auto &t : threads_) t.join();
}

void IoThreads::perform(int fd, IoRequest &x) {
  ssize_t r;
  do {
    r = x.write ? pwritev2(fd, x.iov, 2, x.offset, 0) : preadv2(fd, x.iov, 2, x.offset, 0);
  } while (r < 0 && errno == EINTR);
  x.result = r < 0 ? -errno : r;
}

void IoThreads::work() {
  std::unique_lock lock(mu_);
  for (;;) {
    work_cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (stop_) return;  // only at destruction, when no batch is left
    Batch &b = *queue_.front();
    size_t i = b.next++;
    if (b.next == b.n) queue_.pop_front();
    lock.unlock();
    perform(b.fd, b.r[i]);
    lock.lock();
    if (++b.done == b.n) done_cv_.notify_all();
  }
}

void IoThreads::run(int fd, IoRequest *r, size_t n) {
  if (n == 0) return;
  if (threads_.empty() || n == 1) {
    for (size_t i = 0; i < n; ++i) perform(fd, r[i]);
    return;
  }
  Batch b{fd, r, n};
  std::unique_lock lock(mu_);
  queue_.push_back(&b);
  lock.unlock();
  work_cv_.notify_all();
  lock.lock();
  while (b.next < b.n) {  // the caller takes part, so that its batch always moves
    size_t i = b.next++;
    if (b.next == b.n) queue_.erase(std::find(queue_.begin(), queue_.end(), &b));
    lock.unlock();
    perform(fd, r[i]);
    lock.lock();
    ++b.done;
  }
  done_cv_.wait(lock, [&] { return b.done == b.n; });
}

}  // namespace kvt
