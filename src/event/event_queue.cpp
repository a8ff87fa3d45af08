#include "event/event_queue.hpp"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <system_error>

namespace kvt {

EventQueue::EventQueue(size_t capacity) : capacity_(capacity) {
  fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (fd_ < 0) throw std::system_error(errno, std::generic_category(), "eventfd");
}

EventQueue::~EventQueue() { close(fd_); }

void EventQueue::signal_locked() {
  if (readable_) return;
  uint64_t one = 1;
  // Cannot fail: the counter is far below its limit and the fd is ours.
  [[maybe_unused]] ssize_t r = write(fd_, &one, sizeof one);
  readable_ = true;
}

void EventQueue::push_locked(const kvt_event &e) {
  if (q_.size() >= capacity_) {
    auto victim = std::find_if(q_.begin(), q_.end(), [](const kvt_event &x) {
      return x.type != KVT_EVENT_XFER_DONE;
    });
    if (victim != q_.end()) {
      q_.erase(victim);
      ++dropped_;
    }
  }
  q_.push_back(e);
  signal_locked();
}

void EventQueue::push_block(kvt_event_type type, unsigned tier, uint64_t hash,
                            uint64_t parent) {
  kvt_event e{};
  e.type = type;
  e.tier = tier;
  e.hash = hash;
  e.parent_hash = parent;
  std::lock_guard lock(mu_);
  push_locked(e);
}

size_t EventQueue::poll(kvt_event *out, size_t max) {
  std::lock_guard lock(mu_);
  size_t n = 0;
  if (dropped_ > 0 && n < max) {
    kvt_event d{};
    d.type = KVT_EVENT_EVENTS_DROPPED;
    d.count = dropped_;
    out[n++] = d;
    dropped_ = 0;
  }
  size_t take = std::min(max - n, q_.size());
  std::copy_n(q_.begin(), take, out + n);
  q_.erase(q_.begin(), q_.begin() + take);
  n += take;
  if (readable_ && q_.empty() && dropped_ == 0) {
    uint64_t v;
    [[maybe_unused]] ssize_t r = read(fd_, &v, sizeof v);
    readable_ = false;
  }
  return n;
}

}  // namespace kvt
