// One reader's bounded queue of observe events, with an eventfd readable while it holds
// any. Full: the oldest event gives way and is counted, and the next drain begins with one
// DROPPED event (seq 0) that says how many were lost. Shared between the bus and the host's
// kvt_subscription, so either may go first.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

#include "event/obs_sink.hpp"
#include "kvtier.h"

namespace kvt::obs {

class Subscriber {
 public:
  explicit Subscriber(size_t capacity);  // throws std::system_error if no eventfd
  ~Subscriber();
  Subscriber(const Subscriber &) = delete;
  Subscriber &operator=(const Subscriber &) = delete;

  // Queues e; false when an event was lost for it (the oldest, or e itself).
  bool push(const ObsEvent &e) noexcept;
  size_t drain(kvt_obs_event *out, size_t max) noexcept;
  int fd() const noexcept { return fd_; }

 private:
  ObsEvent &at(size_t i) noexcept { return ring_[(head_ + i) & (ring_.size() - 1)]; }
  void signal_locked() noexcept;

  std::mutex mu_;
  // A power-of-two ring, grown on demand up to capacity_: its events' strings keep their
  // buffers, so a steady stream allocates nothing.
  std::vector<ObsEvent> ring_;
  size_t head_ = 0, size_ = 0;
  size_t capacity_;
  uint64_t dropped_ = 0;  // not yet reported
  bool readable_ = false;
  int fd_;
};

}  // namespace kvt::obs
