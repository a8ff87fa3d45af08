// The bounded event queue drained by kvt_manager_poll, with an eventfd readable while it is
// non-empty. Full queue: the oldest BLOCK_* event gives way and is counted; the count is
// reported by one EVENTS_DROPPED event at the head of the next poll. XFER_DONE and
// TIER_CLEARED events are never dropped (a host that lost BLOCK_* events still learns that a
// tier was emptied), so the queue may exceed its bound by the ones it holds.
#pragma once

#include <absl/container/flat_hash_set.h>

#include <cstdint>
#include <mutex>
#include <vector>

#include "kvtier.h"

namespace kvt {

class EventQueue {
 public:
  explicit EventQueue(size_t capacity);  // throws std::system_error if no eventfd
  ~EventQueue();
  EventQueue(const EventQueue &) = delete;
  EventQueue &operator=(const EventQueue &) = delete;

  // Appends events in order; never throws (an event that cannot be stored counts as dropped).
  void push(const kvt_event *events, size_t n) noexcept;
  size_t poll(kvt_event *out, size_t max);
  // Removes the queued XFER_DONE event naming x, if there is one (kvt_xfer_release).
  void withdraw(const kvt_xfer *x) noexcept;
  int fd() const noexcept { return fd_; }
  uint64_t dropped_total() noexcept {
    std::lock_guard lock(mu_);
    return dropped_total_;
  }

 private:
  kvt_event &at(size_t i) noexcept { return ring_[(head_ + i) & (ring_.size() - 1)]; }
  void push_locked(const kvt_event &e) noexcept;
  void drop_oldest_block_event_locked() noexcept;
  void erase_locked(size_t i) noexcept;
  void signal_locked() noexcept;
  void unsignal_if_drained_locked() noexcept;

  std::mutex mu_;
  std::vector<kvt_event> ring_;  // power-of-two size, grown on demand
  size_t head_ = 0, size_ = 0;
  size_t capacity_;
  uint64_t dropped_ = 0;  // not yet reported
  uint64_t dropped_total_ = 0;
  absl::flat_hash_set<const kvt_xfer *> xfer_queued_;  // transfers with an XFER_DONE queued
  bool untracked_ = false;  // an XFER_DONE could not be recorded in xfer_queued_
  bool readable_ = false;
  int fd_;
};

}  // namespace kvt
