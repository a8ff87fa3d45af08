// The precondition stage: transfers parked on a fence until it is signalled, by the host or
// by a CUDA event that the progress thread polls. One short lock guards every fence's
// waiters; it is never held while a transfer moves on.
#pragma once

#include <memory>
#include <mutex>
#include <vector>

#include "pipeline/transfer.hpp"

namespace kvt {

class PreconditionStage {
 public:
  enum class Outcome { Proceed, Parked, FenceGone, Ended };
  // Parks t on its unsignalled fence (state WAITING), or says that it may proceed, that its
  // fence was destroyed unsignalled, or that t has already ended.
  Outcome admit(const std::shared_ptr<Transfer> &t);
  // The waiters a signal frees; empty when f was signalled before.
  std::vector<std::shared_ptr<Transfer>> signal(Fence &f);
  // The host gave f up: the waiters that can never proceed.
  std::vector<std::shared_ptr<Transfer>> destroy(Fence &f);
  // The waiters of CUDA-event fences whose events have completed.
  std::vector<std::shared_ptr<Transfer>> poll_cuda();
  bool cuda_waiting();

 private:
  std::vector<std::shared_ptr<Transfer>> signal_locked(Fence &f);

  std::mutex mu_;
  std::vector<std::shared_ptr<Fence>> cuda_;  // CUDA-event fences with waiters
};

}  // namespace kvt
