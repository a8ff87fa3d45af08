#include "observe/bus.hpp"

#include <time.h>

#include <algorithm>

#include "common/error.hpp"
#include "observe/log_format.hpp"

namespace kvt::obs {

void Bus::update_on_locked() noexcept {
  const bool keeps = !ring_.empty() || (log_ && log_->is_open());
  keeps_calls_.store(keeps, std::memory_order_relaxed);
  on_.store(keeps || !subs_.empty(), std::memory_order_relaxed);
}

namespace {

uint64_t now_ns() noexcept {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000u + uint64_t(ts.tv_nsec);
}

// A tier's event i of a batch, written over a used event: its strings keep their buffers.
void tier_event(const kvt_event &k, uint64_t seq, uint64_t time_ns, ObsEvent &e) noexcept {
  e = ObsEvent{};  // moving empty strings in frees nothing
  e.seq = seq;
  e.time_ns = time_ns;
  e.kind = k.type == KVT_EVENT_BLOCK_STORED    ? KVT_OBS_BLOCK_STORED
           : k.type == KVT_EVENT_BLOCK_REMOVED ? KVT_OBS_BLOCK_REMOVED
                                               : KVT_OBS_TIER_CLEARED;
  e.dst = k.tier;
  e.hash = k.hash;
  e.parent_hash = k.parent_hash;
}

}  // namespace

void Bus::keep_locked(const ObsEvent &e) noexcept {
  if (!ring_.empty()) {
    try {
      ring_[ring_next_] = e;
    } catch (...) {  // no memory for the id or the arguments: the event without them
      ring_[ring_next_].req_id.clear();
      ring_[ring_next_].args.clear();
    }
    ring_next_ = (ring_next_ + 1) % ring_.size();
    ++ring_filled_;
  }
  if (log_) log_->append(e);
}

void Bus::stamp_locked(ObsEvent &e, uint64_t time_ns) noexcept {
  e.seq = ++seq_;
  e.time_ns = time_ns;
  if (!subs_.empty()) {
    std::string args = std::move(e.args);  // subscribers get no call arguments: not copied
    for (const auto &s : subs_) subscriber_drops_ += !s->push(e);
    e.args = std::move(args);
  }
  keep_locked(e);
}

void Bus::emit(ObsEvent &e) noexcept {
  std::lock_guard lock(mu_);
  stamp_locked(e, now_ns());  // the time read under the lock, so that it follows seq
  if (log_ && log_->failed()) update_on_locked();  // the log stopped: it no longer keeps on_ up
}

// A tier operation can evict hundreds of blocks: each reader takes them under one lock.
void Bus::emit_tier_events(const kvt_event *ev, size_t n) noexcept {
  std::lock_guard lock(mu_);
  const uint64_t t = now_ns(), first = seq_ + 1;
  seq_ += n;
  for (const auto &s : subs_)
    subscriber_drops_ += s->push_each(
        n, [&](size_t i, ObsEvent &e) { tier_event(ev[i], first + i, t, e); });
  if (!ring_.empty() || log_) {
    ObsEvent e;
    for (size_t i = 0; i < n; ++i) {
      tier_event(ev[i], first + i, t, e);
      keep_locked(e);
    }
  }
  if (log_ && log_->failed()) update_on_locked();
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
  std::vector<ObsEvent> fresh(events);  // may throw: nothing changed yet
  std::lock_guard lock(mu_);
  ring_.swap(fresh);
  ring_next_ = 0;
  ring_filled_ = 0;
  update_on_locked();
  return KVT_OK;
}

kvt_status Bus::dump_ring(const std::string &path) {
  std::vector<ObsEvent> copy;
  {
    std::lock_guard lock(mu_);
    if (ring_.empty())
      return fail(KVT_ERR_STATE, "the recorder keeps no ring; kvt_manager_recorder_ring first");
    const size_t n = std::min<uint64_t>(ring_filled_, ring_.size());
    copy.reserve(n);
    const size_t first = (ring_next_ + ring_.size() - n) % ring_.size();
    for (size_t i = 0; i < n; ++i) copy.push_back(ring_[(first + i) % ring_.size()]);
  }
  LogWriter w;
  if (kvt_status st = w.open(path); st != KVT_OK) return st;
  for (const ObsEvent &e : copy) w.append(e);
  return w.close();
}

std::unique_ptr<LogWriter> Bus::take_log_locked() noexcept {
  if (log_) log_drops_ += log_->dropped_total();  // final: only emit appends, under mu_
  std::unique_ptr<LogWriter> w = std::move(log_);
  update_on_locked();
  return w;
}

kvt_status Bus::open_log(const std::string &path) {
  std::lock_guard files(log_mu_);
  std::unique_ptr<LogWriter> stopped;  // by a failed write, which was logged then
  {
    std::lock_guard lock(mu_);
    if (log_ && log_->is_open())
      return fail(KVT_ERR_STATE, "an event log is open already; close it first");
    stopped = take_log_locked();
  }
  stopped.reset();
  auto w = std::make_unique<LogWriter>();
  if (kvt_status st = w->open(path); st != KVT_OK) return st;
  std::lock_guard lock(mu_);
  log_ = std::move(w);
  update_on_locked();
  return KVT_OK;
}

Bus::Counts Bus::counts() {
  std::lock_guard lock(mu_);
  return {seq_, subscriber_drops_, log_drops_ + (log_ ? log_->dropped_total() : 0)};
}

kvt_status Bus::close_log() {
  std::lock_guard files(log_mu_);
  std::unique_ptr<LogWriter> w;
  {
    std::lock_guard lock(mu_);
    w = take_log_locked();  // events from here on are not written
  }
  return w ? w->close() : KVT_OK;
}

}  // namespace kvt::obs
