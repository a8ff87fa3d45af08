#include "pipeline/batcher.hpp"

namespace kvt {

Batcher::Batcher(const PipelineConfig &c)
    : max_batch_(c.max_batch_size), min_batch_(c.min_batch_size),
      flush_interval_(c.flush_interval) {}

void Batcher::add(const std::shared_ptr<Transfer> &t) {
  const size_t n = t->src.size();
  const size_t pieces = (n + max_batch_ - 1) / max_batch_;
  {
    std::lock_guard tl(t->mu);
    t->pieces_left = pieces;
  }
  const Clock::time_point now = Clock::now();
  {
    std::lock_guard lock(mu_);
    for (size_t begin = 0; begin < n; begin += max_batch_)
      queue_.push_back({t, begin, std::min(n, begin + max_batch_), now});
    blocks_ += n;
  }
  cv_.notify_one();
}

bool Batcher::next(std::vector<Piece> *out) {
  out->clear();
  std::unique_lock lock(mu_);
  for (;;) {
    if (stopping_ && queue_.empty()) return false;
    if (!queue_.empty()) {
      // Enough for a batch, or stopping: no reason to wait.
      if (stopping_ || blocks_ >= min_batch_) break;
      Clock::time_point due = queue_.front().batched_at + flush_interval_;
      if (due <= Clock::now()) break;
      cv_.wait_until(lock, due);
    } else {
      cv_.wait(lock);
    }
  }
  size_t blocks = 0;
  while (!queue_.empty()) {
    const Piece &p = queue_.front();
    const size_t n = p.end - p.begin;
    if (!out->empty() && blocks + n > max_batch_) break;
    blocks += n;
    blocks_ -= n;
    out->push_back(std::move(queue_.front()));
    queue_.pop_front();
  }
  if (!queue_.empty()) cv_.notify_one();  // more for another executor
  return true;
}

void Batcher::stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
}

}  // namespace kvt
