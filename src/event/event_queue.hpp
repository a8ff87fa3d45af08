// The bounded event queue drained by kvt_poll, with an eventfd readable while it is
// non-empty. Full queue: the oldest BLOCK_* event gives way and is counted; the count is
// reported by one EVENTS_DROPPED event at the head of the next poll. XFER_DONE events are
// never dropped.
#pragma once

#include <cstdint>
#include <deque>
#include <mutex>

#include "kvtier.h"

namespace kvt {

class EventQueue {
 public:
  explicit EventQueue(size_t capacity);  // throws std::system_error if no eventfd
  ~EventQueue();
  EventQueue(const EventQueue &) = delete;
  EventQueue &operator=(const EventQueue &) = delete;

  void push_block(kvt_event_type type, unsigned tier, uint64_t hash, uint64_t parent);
  size_t poll(kvt_event *out, size_t max);
  int fd() const noexcept { return fd_; }

 private:
  void push_locked(const kvt_event &e);
  void signal_locked();

  std::mutex mu_;
  std::deque<kvt_event> q_;
  size_t capacity_;
  uint64_t dropped_ = 0;  // not yet reported
  bool readable_ = false;
  int fd_;
};

}  // namespace kvt
