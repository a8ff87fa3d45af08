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
  // Queues n events under one lock, fill(i, slot) writing the i-th into its slot (a used
  // event whose strings keep their buffers); returns how many events were lost.
  template <class Fill>
  uint64_t push_each(size_t n, Fill &&fill) noexcept {
    std::lock_guard lock(mu_);
    const uint64_t before = dropped_;
    for (size_t i = 0; i < n; ++i)
      if (ObsEvent *slot = next_slot_locked()) fill(i, *slot);
    signal_locked();
    return dropped_ - before;
  }
  // Safe from any number of threads; the events are converted outside the lock that
  // pushes take, so that a reader never holds up the engine for more than a swap each.
  size_t drain(kvt_obs_event *out, size_t max) noexcept;
  int fd() const noexcept { return fd_; }

 private:
  ObsEvent &at(size_t i) noexcept { return ring_[(head_ + i) & (ring_.size() - 1)]; }
  ObsEvent *next_slot_locked() noexcept;  // null when out of memory (counted as lost)
  void signal_locked() noexcept;

  std::mutex drain_mu_;  // taken before mu_, by drain only: guards taken_
  std::vector<ObsEvent> taken_;  // the events being converted; their buffers go back
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
