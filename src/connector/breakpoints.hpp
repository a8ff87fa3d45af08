// Breakpoints on the scheduler half: a thread inside a scheduler call stops where a slot
// enters a state, or where a call names a request, until resumed or until the pause times
// out. What the scheduler looked like at the pause is kept for inspection meanwhile (the
// paused thread holds the connector's lock). Synchronized by itself: every method but
// check() is called from other threads.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "event/obs_sink.hpp"
#include "kvtier.h"

namespace kvt::conn {

// The scheduler as inspection shows it.
struct Snapshot {
  std::vector<kvt_slot_info> slots;
  std::vector<kvt_batch_info> batches;
  kvt_connector_stats stats{};
};

class Breakpoints {
 public:
  // One branch for the scheduler while nothing is set.
  bool armed() const noexcept { return kObserve && armed_.load(std::memory_order_relaxed); }

  // The new breakpoint's id (1, 2, ...), or 0 with KVT_MAX_BREAKPOINTS set already: the
  // endpoint lets its clients add them, and each costs a check on every scheduler call.
  uint64_t add(uint32_t state, std::string req_id);
  bool remove(uint64_t id);
  void clear();  // every breakpoint; a paused thread stays paused until resumed
  void release();  // every breakpoint, a pause asked for, and a thread paused now
  void pause_next();
  kvt_status resume();
  // True with *out once a thread is paused; false after timeout (< 0: none).
  bool wait_paused(kvt_pause_info *out, std::chrono::nanoseconds timeout);
  void set_timeout(std::chrono::milliseconds t);
  // While paused: a copy of the snapshot taken at the pause.
  bool paused_snapshot(Snapshot *out);

  // Called by the scheduler with its lock held: at a call's start (prev = state = 0) or
  // after a slot moved from prev to state. Pauses if a breakpoint matches; snapshot() is
  // called only then.
  void check(kvt_obs_trigger trigger, std::string_view req_id, uint32_t prev, uint32_t state,
             const std::function<Snapshot()> &snapshot);

 private:
  struct Point {
    uint64_t id;
    uint32_t state;
    std::string req_id;  // "" for any
  };
  void rearm_locked() { armed_ = pause_next_ || !points_.empty(); }

  std::atomic<bool> armed_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Point> points_;
  uint64_t next_id_ = 1, pauses_ = 0, resumes_ = 0;
  bool pause_next_ = false;
  bool paused_ = false;
  kvt_pause_info info_{};
  Snapshot snap_;
  std::chrono::milliseconds timeout_{30000};
};

}  // namespace kvt::conn
