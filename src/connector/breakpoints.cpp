#include "connector/breakpoints.hpp"

#include <algorithm>

#include "common/log.hpp"

namespace kvt::conn {

uint64_t Breakpoints::add(uint32_t state, std::string req_id) {
  std::lock_guard lock(mu_);
  if (points_.size() >= KVT_MAX_BREAKPOINTS) return 0;
  points_.push_back(Point{next_id_, state, std::move(req_id)});
  rearm_locked();
  return next_id_++;
}

bool Breakpoints::remove(uint64_t id) {
  std::lock_guard lock(mu_);
  const size_t before = points_.size();
  std::erase_if(points_, [&](const Point &p) { return p.id == id; });
  rearm_locked();
  return points_.size() != before;
}

void Breakpoints::clear() {
  std::lock_guard lock(mu_);
  points_.clear();
  rearm_locked();
}

void Breakpoints::release() {
  std::lock_guard lock(mu_);
  points_.clear();
  pause_next_ = false;
  rearm_locked();
  // Counted even with nobody paused: a thread between its match and its pause (taking the
  // snapshot) sees it and does not wait.
  paused_ = false;
  ++resumes_;
  cv_.notify_all();
}

void Breakpoints::pause_next() {
  std::lock_guard lock(mu_);
  pause_next_ = true;
  rearm_locked();
}

kvt_status Breakpoints::resume() {
  std::lock_guard lock(mu_);
  if (!paused_) return KVT_ERR_STATE;
  paused_ = false;  // at once, for whoever asks next; the thread wakes on resumes_
  ++resumes_;
  cv_.notify_all();
  return KVT_OK;
}

bool Breakpoints::wait_paused(kvt_pause_info *out, std::chrono::nanoseconds timeout) {
  std::unique_lock lock(mu_);
  const auto paused = [&] { return paused_; };
  // A year stands for any longer wait: now + INT64_MAX ns would overflow the clock.
  const std::chrono::nanoseconds year = std::chrono::hours(24 * 365);
  if (timeout.count() < 0)
    cv_.wait(lock, paused);
  else if (!cv_.wait_for(lock, std::min(timeout, year), paused))
    return false;
  *out = info_;
  return true;
}

void Breakpoints::set_timeout(std::chrono::milliseconds t) {
  std::lock_guard lock(mu_);
  timeout_ = t;
}

bool Breakpoints::paused_snapshot(Snapshot *out) {
  std::lock_guard lock(mu_);
  if (!paused_) return false;
  *out = snap_;
  return true;
}

void Breakpoints::check(kvt_obs_trigger trigger, std::string_view req_id, uint32_t prev,
                        uint32_t state, const std::function<Snapshot()> &snapshot) {
  std::unique_lock lock(mu_);
  uint64_t hit = 0;
  bool matched = pause_next_;
  for (const Point &p : points_) {
    const bool id_ok = p.req_id.empty() || p.req_id == req_id;
    const bool state_ok = p.state == 0 ? state == 0 && !p.req_id.empty() : p.state == state;
    if (id_ok && state_ok) {
      hit = p.id;
      matched = true;
      break;
    }
  }
  if (!matched) return;
  pause_next_ = false;
  rearm_locked();
  const uint64_t resumes = resumes_;
  lock.unlock();
  Snapshot snap = snapshot();  // outside mu_: it may take a while
  lock.lock();
  if (resumes_ != resumes) return;  // released meanwhile
  snap_ = std::move(snap);
  info_ = kvt_pause_info{};
  info_.struct_size = sizeof info_;
  info_.trigger = trigger;
  info_.prev = prev;
  info_.state = state;
  info_.breakpoint = hit;
  info_.pauses = ++pauses_;
  req_id.copy(info_.req_id, KVT_REQ_ID_MAX);  // not memcpy: a call without an id has no data()
  paused_ = true;
  cv_.notify_all();
  const bool resumed = cv_.wait_for(lock, timeout_, [&] { return resumes_ != resumes; });
  paused_ = false;
  snap_ = Snapshot{};
  if (resumed) return;
  // Logged after mu_, which stays a leaf: the log's lock is held while the host's callback runs.
  const kvt_pause_info info = info_;
  const long long ms = timeout_.count();
  lock.unlock();
  log(KVT_LOG_WARN, "connector: the pause at request '%s' timed out after %lld ms; going on",
      info.req_id, ms);
}

}  // namespace kvt::conn
