// The batcher: containers that passed their precondition, cut into pieces of at most
// max_batch_size blocks, wait here until a batch is due: min_batch_size blocks, or the oldest
// piece waited flush_interval. Its lock guards only the queue: a cancelled transfer's pieces
// stay queued and are skipped when taken.
#pragma once

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include "pipeline/config.hpp"
#include "pipeline/transfer.hpp"

namespace kvt {

class Batcher {
 public:
  explicit Batcher(const PipelineConfig &c);

  // Queues t's container (state BATCHED, set by the caller) as pieces.
  void add(const std::shared_ptr<Transfer> &t);
  // Waits for a due batch and takes it: pieces of at most max_batch_size blocks together.
  // After stop(), takes whatever is left at once; false when nothing is.
  bool next(std::vector<Piece> *out);
  void stop();

 private:
  const size_t max_batch_, min_batch_;
  const Clock::duration flush_interval_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Piece> queue_;  // oldest first
  size_t blocks_ = 0;        // in queue_
  bool stopping_ = false;
};

}  // namespace kvt
