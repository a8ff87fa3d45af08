#include "observe/subscriber.hpp"

#include <sys/eventfd.h>
#include <unistd.h>

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

void Subscriber::push(const kvt_obs_event &e) noexcept {
  std::lock_guard lock(mu_);
  if (q_.size() >= capacity_) {
    q_.pop_front();
    ++dropped_;
  }
  try {
    q_.push_back(e);
  } catch (...) {  // out of memory: the event counts as lost
    ++dropped_;
  }
  signal_locked();
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
  for (; n < max && !q_.empty(); ++n) {
    out[n] = q_.front();
    q_.pop_front();
  }
  if (readable_ && q_.empty() && dropped_ == 0) {
    uint64_t v;
    [[maybe_unused]] ssize_t r = read(fd_, &v, sizeof v);
    readable_ = false;
  }
  return n;
}

}  // namespace kvt::obs
