#include "event/event_queue.hpp"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <new>
#include <system_error>

namespace kvt {

EventQueue::EventQueue(size_t capacity)
    : ring_(std::bit_ceil(std::min<size_t>(capacity, 1024))), capacity_(capacity) {
  fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (fd_ < 0) throw std::system_error(errno, std::generic_category(), "eventfd");
}

EventQueue::~EventQueue() { close(fd_); }

void EventQueue::signal_locked() noexcept {
  if (readable_) return;
  uint64_t one = 1;
  // Cannot fail: the counter is far below its limit and the fd is ours.
  [[maybe_unused]] ssize_t r = write(fd_, &one, sizeof one);
  readable_ = true;
}

void EventQueue::unsignal_if_drained_locked() noexcept {
  if (!readable_ || size_ > 0 || dropped_ > 0) return;
  uint64_t v;
  [[maybe_unused]] ssize_t r = read(fd_, &v, sizeof v);
  readable_ = false;
}

void EventQueue::erase_locked(size_t i) noexcept {
  for (; i > 0; --i) at(i) = at(i - 1);  // close the gap from the front
  head_ = (head_ + 1) & (ring_.size() - 1);
  --size_;
}

void EventQueue::drop_oldest_block_event_locked() noexcept {
  size_t i = 0;
  while (i < size_ && (at(i).type == KVT_EVENT_XFER_DONE || at(i).type == KVT_EVENT_TIER_CLEARED))
    ++i;
  if (i == size_) return;  // nothing but XFER_DONE and TIER_CLEARED: keep them all
  erase_locked(i);
  ++dropped_;
  ++dropped_total_;
}

void EventQueue::withdraw(const kvt_xfer *x) noexcept {
  std::lock_guard lock(mu_);
  if (xfer_queued_.erase(x) == 0 && !untracked_) return;
  for (size_t i = 0; i < size_; ++i) {
    if (at(i).type == KVT_EVENT_XFER_DONE && at(i).xfer == x) {
      erase_locked(i);
      break;
    }
  }
  unsignal_if_drained_locked();
}

void EventQueue::push_locked(const kvt_event &e) noexcept {
  if (size_ >= capacity_) drop_oldest_block_event_locked();
  if (size_ == ring_.size()) {
    try {
      std::vector<kvt_event> bigger(ring_.size() * 2);
      for (size_t i = 0; i < size_; ++i) bigger[i] = at(i);
      ring_.swap(bigger);
      head_ = 0;
    } catch (const std::bad_alloc &) {
      ++dropped_;
      ++dropped_total_;
      return;
    }
  }
  if (e.type == KVT_EVENT_XFER_DONE) {
    try {
      xfer_queued_.insert(e.xfer);
    } catch (const std::bad_alloc &) {
      untracked_ = true;  // withdraw() then searches the whole queue
    }
  }
  at(size_++) = e;
}

void EventQueue::push(const kvt_event *events, size_t n) noexcept {
  std::lock_guard lock(mu_);
  for (size_t i = 0; i < n; ++i) push_locked(events[i]);
  signal_locked();
}

size_t EventQueue::poll(kvt_event *out, size_t max) {
  std::lock_guard lock(mu_);
  size_t n = 0;
  if (dropped_ > 0 && max > 0) {
    kvt_event d{};
    d.type = KVT_EVENT_EVENTS_DROPPED;
    d.count = dropped_;
    out[n++] = d;
    dropped_ = 0;
  }
  size_t take = std::min(max - n, size_);
  for (size_t i = 0; i < take; ++i) {
    out[n + i] = at(i);
    if (out[n + i].type == KVT_EVENT_XFER_DONE) xfer_queued_.erase(out[n + i].xfer);
  }
  head_ = (head_ + take) & (ring_.size() - 1);
  size_ -= take;
  n += take;
  unsignal_if_drained_locked();
  return n;
}

}  // namespace kvt
