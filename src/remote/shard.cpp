#include "remote/shard.hpp"

namespace kvt::remote {

kvt_status Shard::acquire(std::unique_ptr<Connection> *out) {
  uint64_t epoch;
  {
    std::lock_guard lock(mu_);
    if (!idle_.empty()) {
      *out = std::move(idle_.back());
      idle_.pop_back();
      return KVT_OK;
    }
    epoch = epoch_;
  }
  std::unique_ptr<Connection> c;
  kvt_status s = Connection::open(&c, endpoint_, password_, timeout_us_);
  std::lock_guard lock(mu_);
  if (s != KVT_OK) {
    failed_ = true;
    return s;
  }
  if (failed_) {
    failed_ = false;
    reconnects_.fetch_add(1, std::memory_order_relaxed);
  }
  c->epoch = epoch;
  *out = std::move(c);
  return KVT_OK;
}

void Shard::release(std::unique_ptr<Connection> c, bool ok) {
  std::vector<std::unique_ptr<Connection>> closing;  // closed outside the lock
  std::lock_guard lock(mu_);
  if (!ok) {
    failed_ = true;
    ++epoch_;
    closing.swap(idle_);
  } else if (c->epoch == epoch_ && idle_.size() < kMaxIdle) {
    idle_.push_back(std::move(c));
  }
  // c (when not kept) and closing go as the function returns, after the lock.
}

}  // namespace kvt::remote
