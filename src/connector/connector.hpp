// The connector: a scheduler half and a worker half over one manager, the lock that
// serializes the scheduler half, the host's hooks around its calls, and what inspection
// reads. kvt_connector (src/abi/) is this object behind a C handle.
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "connector/scheduler.hpp"
#include "connector/worker.hpp"
#include "event/obs_sink.hpp"
#include "kvtier.h"

namespace kvt {
class Manager;
}

namespace kvt::conn {

class Connector {
 public:
  static constexpr uint32_t kMaxPauseMs = 3600u * 1000u;  // a breakpoint's pause, at most

  static void defaults(kvt_connector_config *c) noexcept;
  // Checks c against m (fn names the caller in the error), and fills num_gpu_blocks' default.
  static kvt_status validate(kvt_connector_config *c, const Manager &m, const char *fn);
  // *out: a connector of c's halves over m, which serves one connector at a time.
  static kvt_status create(std::unique_ptr<Connector> *out, Manager &m,
                           const kvt_connector_config &c, const char *fn);
  // A call paused at a breakpoint is let go and waited for; the worker's copies end before
  // the scheduler drops their pins.
  ~Connector();
  Connector(const Connector &) = delete;
  Connector &operator=(const Connector &) = delete;

  Manager &manager() const noexcept { return mgr_; }
  Scheduler *scheduler() noexcept { return sched_.get(); }
  Worker *worker() noexcept { return worker_.get(); }

  // op(Scheduler &) under the scheduler half's lock; KVT_ERR_STATE without that half.
  template <class Op>
  kvt_status with_scheduler(const char *fn, Op &&op) {
    if (!sched_) return no_scheduler(fn);
    std::lock_guard lock(mu_);
    return op(*sched_);
  }
  // with_scheduler for the six calls of vLLM's scheduler side, with the hooks around op.
  template <class Op>
  kvt_status call(const char *fn, kvt_obs_trigger trigger, const char *req_id, Op &&op) {
    return with_scheduler(fn, [&](Scheduler &s) {
      const kvt_connector_hooks &h = s.hooks();
      if (!kObserve || (!h.will_call && !h.finished_call)) return op(s);  // the one branch
      const char *id = req_id && check_id(fn, req_id) == KVT_OK ? req_id : nullptr;
      if (h.will_call) h.will_call(h.user, trigger, id);
      kvt_status st = op(s);
      if (h.finished_call) h.finished_call(h.user, trigger, id, st);
      return st;
    });
  }
  // op(Breakpoints &) without the lock, which a paused call holds.
  template <class Op>
  kvt_status with_breakpoints(const char *fn, Op &&op) {
    return sched_ ? op(sched_->breakpoints()) : no_scheduler(fn);
  }
  // op(Worker &): the worker half synchronizes itself, so that its waits block nothing else.
  template <class Op>
  kvt_status with_worker(const char *fn, Op &&op) {
    return worker_ ? op(*worker_) : no_worker(fn);
  }

  // The bytes of the last build_connector_meta, which the host reads until the next one.
  std::string &meta() noexcept { return meta_; }
  // What inspection shows: the state at the pause while the scheduler is paused (its thread
  // holds the lock), else the state now, under the lock. Needs the scheduler half.
  Snapshot inspect();
  // For the metrics text: the live slots per state and the counters; false without a
  // scheduler half.
  bool slot_counts(uint64_t slots[kSlotStates], kvt_connector_stats *st);

 private:
  Connector(Manager &m) noexcept : mgr_(m) {}
  static kvt_status no_scheduler(const char *fn);
  static kvt_status no_worker(const char *fn);

  Manager &mgr_;
  std::mutex mu_;  // serializes the scheduler half
  std::unique_ptr<Scheduler> sched_;
  std::unique_ptr<Worker> worker_;
  std::string meta_;
};

}  // namespace kvt::conn
