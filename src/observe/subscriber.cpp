#include "observe/subscriber.hpp"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <system_error>

namespace kvt::obs {

Subscriber::Subscriber(size_t capacity) : capacity_(capacity) {
  fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (fd_ < 0) throw std::system_error(errno, std::generic_category(), "eventfd");
}

Subscriber::~Subscriber() { close(fd_); }

void Subscriber::signal_locked() noexcept {
  if (readable_) return;
  uint64_t one = 1;
  [[maybe_unused]] ssize_t r = write(fd_, &one, sizeof one);  // cannot fail: our fd, far from full
  readable_ = true;
}

ObsEvent *Subscriber::next_slot_locked() noexcept {
  try {
    if (size_ == ring_.size() && size_ < capacity_) {  // grow: the oldest first again
      std::vector<ObsEvent> bigger(std::min(std::max<size_t>(ring_.size() * 2, 64),
                                            std::bit_ceil(capacity_)));
      for (size_t i = 0; i < size_; ++i) bigger[i] = std::move(at(i));
      ring_.swap(bigger);
      head_ = 0;
    }
  } catch (...) {  // out of memory: the event counts as lost
    ++dropped_;
    return nullptr;
  }
  if (size_ == capacity_) {
    head_ = (head_ + 1) & (ring_.size() - 1);
    --size_;
    ++dropped_;
  }
  return &at(size_++);
}

bool Subscriber::push(const ObsEvent &e) noexcept {
  return push_each(1, [&e](size_t, ObsEvent &slot) {
           try {
             slot = e;
           } catch (...) {  // no memory for its strings: the event without them
             slot.req_id.clear();
             slot.args.clear();
           }
         }) == 0;
}

size_t Subscriber::drain(kvt_obs_event *out, size_t max) noexcept {
  std::lock_guard drainer(drain_mu_);
  size_t n = 0, took = 0;
  {
    std::lock_guard lock(mu_);
    if (dropped_ > 0 && max > 0) {
      out[n] = kvt_obs_event{};
      out[n].kind = KVT_OBS_DROPPED;
      out[n].count = dropped_;
      ++n;
      dropped_ = 0;
    }
    took = std::min(size_, max - n);
    if (taken_.size() < took) {
      try {
        taken_.resize(std::max(took, std::min<size_t>(ring_.size(), 256)));
      } catch (...) {  // no memory to take them out: converted under the lock instead
        for (; n < max && size_ > 0; ++n) {
          to_c(at(0), &out[n]);
          head_ = (head_ + 1) & (ring_.size() - 1);
          --size_;
        }
        took = 0;
      }
    }
    // Swapped, not moved: the ring's and taken_'s strings trade buffers, and none is freed.
    for (size_t i = 0; i < took; ++i) {
      std::swap(taken_[i], at(0));
      head_ = (head_ + 1) & (ring_.size() - 1);
      --size_;
    }
    if (readable_ && size_ == 0 && dropped_ == 0) {
      uint64_t v;
      [[maybe_unused]] ssize_t r = read(fd_, &v, sizeof v);
      readable_ = false;
    }
  }
  for (size_t i = 0; i < took; ++i) to_c(taken_[i], &out[n + i]);
  return n + took;
}

}  // namespace kvt::obs
