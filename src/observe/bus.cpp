#include "observe/bus.hpp"

#include <time.h>

#include <algorithm>

#include "common/error.hpp"
#include "observe/log_format.hpp"

namespace kvt::obs {

Bus::~Bus() { log_.close(); }

void Bus::update_on_locked() noexcept {
  on_.store(!subs_.empty() || !ring_.empty() || log_.is_open(), std::memory_order_relaxed);
}

void Bus::emit(kvt_obs_event &e) noexcept {
  std::lock_guard lock(mu_);
  timespec ts;  // read under the lock, so that time follows the sequence
  clock_gettime(CLOCK_MONOTONIC, &ts);
  e.seq = ++seq_;
  e.time_ns = uint64_t(ts.tv_sec) * 1000000000u + uint64_t(ts.tv_nsec);
  for (const auto &s : subs_) s->push(e);
  if (!ring_.empty()) {
    ring_[ring_next_] = e;
    ring_next_ = (ring_next_ + 1) % ring_.size();
    ++ring_filled_;
  }
  log_.append(e);
  if (!log_.is_open()) update_on_locked();  // a write failed
}

void Bus::subscribe(std::shared_ptr<Subscriber> s) {
  std::lock_guard lock(mu_);
  subs_.push_back(std::move(s));
  update_on_locked();
}

void Bus::unsubscribe(const Subscriber *s) noexcept {
  std::lock_guard lock(mu_);
  std::erase_if(subs_, [&](const auto &p) { return p.get() == s; });
  update_on_locked();
}

kvt_status Bus::set_ring(size_t events) {
  std::vector<kvt_obs_event> fresh(events);  // may throw: nothing changed yet
  std::lock_guard lock(mu_);
  ring_.swap(fresh);
  ring_next_ = 0;
  ring_filled_ = 0;
  update_on_locked();
  return KVT_OK;
}

kvt_status Bus::dump_ring(const std::string &path) {
  std::vector<kvt_obs_event> copy;
  {
    std::lock_guard lock(mu_);
    if (ring_.empty()) return fail(KVT_ERR_STATE, "the recorder keeps no ring; kvt_recorder_ring first");
    const size_t n = std::min<uint64_t>(ring_filled_, ring_.size());
    copy.reserve(n);
    const size_t first = (ring_next_ + ring_.size() - n) % ring_.size();
    for (size_t i = 0; i < n; ++i) copy.push_back(ring_[(first + i) % ring_.size()]);
  }
  LogWriter w;
  if (kvt_status st = w.open(path); st != KVT_OK) return st;
  for (const kvt_obs_event &e : copy) w.append(e);
  return w.close();
}

kvt_status Bus::open_log(const std::string &path) {
  std::lock_guard lock(mu_);
  if (log_.is_open())
    return fail(KVT_ERR_STATE, "an event log is open already; close it first");
  if (kvt_status st = log_.open(path); st != KVT_OK) return st;
  update_on_locked();
  return KVT_OK;
}

kvt_status Bus::close_log() {
  std::lock_guard lock(mu_);
  kvt_status st = log_.close();
  update_on_locked();
  return st;
}

}  // namespace kvt::obs
