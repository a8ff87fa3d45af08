#include "pipeline/precondition.hpp"

#include <algorithm>
#include <bit>

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
  // Waiters that ended and went are dropped now and then (at powers of two: amortized).
  if (f->waiters.size() >= 32 && std::has_single_bit(f->waiters.size()))
    std::erase_if(f->waiters, [](const std::weak_ptr<Transfer> &w) { return w.expired(); });
  // A CUDA fence is polled once it has a waiter (listed twice at worst, which is harmless).
  if (f->cuda_event != nullptr && f->waiters.empty()) cuda_.push_back(f);
  f->waiters.push_back(t);
  return Outcome::Parked;
}

namespace {
// The waiters still alive (not ended and dropped), taken off the fence.
std::vector<std::shared_ptr<Transfer>> take_waiters(Fence &f) {
  std::vector<std::shared_ptr<Transfer>> out;
  for (auto &w : f.waiters)
    if (auto t = w.lock()) out.push_back(std::move(t));
  f.waiters.clear();
  return out;
}
}  // namespace

std::vector<std::shared_ptr<Transfer>> PreconditionStage::signal_locked(Fence &f) {
  if (f.signalled) return {};
  f.signalled = true;
  return take_waiters(f);
}

std::vector<std::shared_ptr<Transfer>> PreconditionStage::signal(Fence &f) {
  std::lock_guard lock(mu_);
  return signal_locked(f);
}

std::vector<std::shared_ptr<Transfer>> PreconditionStage::destroy(Fence &f) {
  std::lock_guard lock(mu_);
  f.host_holds = false;
  std::vector<std::shared_ptr<Transfer>> stranded;
  if (!f.signalled) stranded = take_waiters(f);
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
