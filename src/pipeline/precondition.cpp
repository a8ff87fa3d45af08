#include "pipeline/precondition.hpp"

#include <algorithm>

#include "memory/cuda.hpp"

namespace kvt {

PreconditionStage::Outcome PreconditionStage::admit(const std::shared_ptr<Transfer> &t) {
  const std::shared_ptr<Fence> &f = t->fence;
  if (f == nullptr) return Outcome::Proceed;
  std::lock_guard lock(mu_);
  if (f->signalled) return Outcome::Proceed;
  if (!f->host_holds) return Outcome::FenceGone;
  {
    std::lock_guard tl(t->mu);
    if (t->ended()) return Outcome::Ended;
    t->state = KVT_XFER_WAITING;
  }
  f->waiters.push_back(t);
  if (f->cuda_event != nullptr && f->waiters.size() == 1) cuda_.push_back(f);
  return Outcome::Parked;
}

std::vector<std::shared_ptr<Transfer>> PreconditionStage::signal_locked(Fence &f) {
  std::vector<std::shared_ptr<Transfer>> ready;
  if (f.signalled) return ready;
  f.signalled = true;
  ready.swap(f.waiters);
  return ready;
}

std::vector<std::shared_ptr<Transfer>> PreconditionStage::signal(Fence &f) {
  std::lock_guard lock(mu_);
  return signal_locked(f);
}

std::vector<std::shared_ptr<Transfer>> PreconditionStage::destroy(Fence &f) {
  std::lock_guard lock(mu_);
  f.host_holds = false;
  std::vector<std::shared_ptr<Transfer>> stranded;
  if (!f.signalled) stranded.swap(f.waiters);
  std::erase_if(cuda_, [&](const std::shared_ptr<Fence> &c) { return c.get() == &f; });
  return stranded;
}

std::vector<std::shared_ptr<Transfer>> PreconditionStage::poll_cuda() {
  std::lock_guard lock(mu_);
  std::vector<std::shared_ptr<Transfer>> ready;
  std::erase_if(cuda_, [&](const std::shared_ptr<Fence> &f) {
    if (f->signalled || f->waiters.empty()) return true;
    if (!cuda::event_done(f->cuda_event)) return false;
    for (auto &t : signal_locked(*f)) ready.push_back(std::move(t));
    return true;
  });
  return ready;
}

bool PreconditionStage::cuda_waiting() {
  std::lock_guard lock(mu_);
  return !cuda_.empty();
}

}  // namespace kvt
