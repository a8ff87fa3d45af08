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

bool Subscriber::push(const ObsEvent &e) noexcept {
  std::lock_guard lock(mu_);
  const uint64_t before = dropped_;
  try {
    if (size_ == ring_.size() && size_ < capacity_) {  // grow: the oldest first again
      std::vector<ObsEvent> bigger(std::min(std::max<size_t>(ring_.size() * 2, 64),
                                            std::bit_ceil(capacity_)));
      for (size_t i = 0; i < size_; ++i) bigger[i] = std::move(at(i));
      ring_.swap(bigger);
      head_ = 0;
    }
    if (size_ == capacity_) {
      head_ = (head_ + 1) & (ring_.size() - 1);
      --size_;
      ++dropped_;
    }
    at(size_) = e;
    ++size_;
  } catch (...) {  // out of memory: the event counts as lost
    ++dropped_;
  }
  signal_locked();
  return dropped_ == before;
}

size_t Subscriber::drain(kvt_obs_event *out, size_t max) noexcept {
  std::lock_guard lock(mu_);
  size_t n = 0;
  if (dropped_ > 0 && n < max) {
    out[n] = kvt_obs_event{};
    out[n].kind = KVT_OBS_DROPPED;
    out[n].count = dropped_;
    ++n;
    dropped_ = 0;
  }
  for (; n < max && size_ > 0; ++n) {
    to_c(at(0), &out[n]);
    head_ = (head_ + 1) & (ring_.size() - 1);
    --size_;
  }
  if (readable_ && size_ == 0 && dropped_ == 0) {
    uint64_t v;
    [[maybe_unused]] ssize_t r = read(fd_, &v, sizeof v);
    readable_ = false;
  }
  return n;
}

}  // namespace kvt::obs
