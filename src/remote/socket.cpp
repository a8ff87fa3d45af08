#include "remote/socket.hpp"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <string>

#include "common/error.hpp"
#include "remote/resolve.hpp"

namespace kvt::remote {
namespace {

constexpr const char *kTimedOut = "timed out (g4_timeout_us)";

// Waits until one of p[0..n) is ready for its events or the deadline passes (false, errno
// ETIMEDOUT).
bool wait_any(pollfd *p, size_t n, Deadline d) {
  for (;;) {
    auto left = d - std::chrono::steady_clock::now();
    if (left <= left.zero()) {
      errno = ETIMEDOUT;
      return false;
    }
    auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
    timespec ts{time_t(ns / 1000000000), long(ns % 1000000000)};
    int r = ppoll(p, nfds_t(n), &ts, nullptr);
    if (r > 0) return true;  // ready, or an error the next call reports
    if (r < 0 && errno != EINTR) return false;
  }
}

bool wait_ready(int fd, short events, Deadline d) {
  pollfd p{fd, events, 0};
  return wait_any(&p, 1, d);
}

const char *reason(int err) { return err == ETIMEDOUT ? kTimedOut : strerror(err); }

// Connects fd to a by the deadline; on failure *why says why.
bool connect_by(int fd, const sockaddr *a, socklen_t len, Deadline d, std::string *why) {
  if (connect(fd, a, len) == 0) return true;
  if (errno != EINPROGRESS) {
    *why = strerror(errno);
    return false;
  }
  if (!wait_ready(fd, POLLOUT, d)) {
    *why = reason(errno);
    return false;
  }
  int err = 0;
  socklen_t el = sizeof err;
  if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0) err = errno;
  if (err == 0) return true;
  *why = strerror(err);
  return false;
}

}  // namespace

kvt_status dial(int *out, const Endpoint &e, Deadline d) {
  std::string why;
  if (e.is_unix()) {
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    if (e.path.size() >= sizeof a.sun_path)
      return fail(KVT_ERR_IO, "cannot connect: the socket path is over %zu bytes",
                  sizeof a.sun_path - 1);
    std::memcpy(a.sun_path, e.path.c_str(), e.path.size() + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return fail(KVT_ERR_IO, "cannot connect: %s", strerror(errno));
    if (connect_by(fd, reinterpret_cast<const sockaddr *>(&a), sizeof a, d, &why)) {
      *out = fd;
      return KVT_OK;
    }
    close(fd);
    return fail(KVT_ERR_IO, "cannot connect: %s", why.c_str());
  }
  Addresses addrs;
  if (kvt_status st = resolve(&addrs, e.host, e.port, d); st != KVT_OK) return st;
  for (const addrinfo *ai = addrs.get(); ai != nullptr; ai = ai->ai_next) {
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                    ai->ai_protocol);
    if (fd < 0) {
      why = strerror(errno);
      continue;
    }
    if (connect_by(fd, ai->ai_addr, ai->ai_addrlen, d, &why)) {
      int one = 1;  // pipelined batches are written whole: nothing to gather
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      *out = fd;
      return KVT_OK;
    }
    close(fd);
  }
  return fail(KVT_ERR_IO, "cannot connect: %s", why.c_str());
}

namespace {

// Writes what o's socket takes now; false when it failed (o.status set).
bool write_some(Outgoing &o) {
  auto skip_sent = [&o] {
    while (o.at < o.iov.size() && o.iov[o.at].iov_len == 0) ++o.at;
  };
  skip_sent();
  while (o.at < o.iov.size()) {
    msghdr m{};
    m.msg_iov = o.iov.data() + o.at;
    m.msg_iovlen = std::min<size_t>(o.iov.size() - o.at, IOV_MAX);
    ssize_t n = sendmsg(o.fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
      o.status = fail(KVT_ERR_IO, "sending failed: %s", reason(errno));
      o.error = last_error();
      return false;
    }
    for (size_t left = size_t(n); left > 0;) {
      size_t c = std::min(left, o.iov[o.at].iov_len);
      o.iov[o.at].iov_base = static_cast<char *>(o.iov[o.at].iov_base) + c;
      o.iov[o.at].iov_len -= c;
      left -= c;
      if (o.iov[o.at].iov_len == 0) ++o.at;
    }
    skip_sent();
  }
  return true;
}

}  // namespace

void send_all(Outgoing *out, size_t n, Deadline d) {
  std::vector<pollfd> waiting;
  std::vector<Outgoing *> whose;
  for (;;) {
    waiting.clear();
    whose.clear();
    for (size_t k = 0; k < n; ++k) {
      Outgoing &o = out[k];
      if (o.status != KVT_OK || !write_some(o) || o.at == o.iov.size()) continue;
      waiting.push_back({o.fd, POLLOUT, 0});
      whose.push_back(&o);
    }
    if (waiting.empty()) return;
    if (!wait_any(waiting.data(), waiting.size(), d)) {
      const int err = errno;
      for (Outgoing *o : whose) {
        o->status = fail(KVT_ERR_IO, "sending failed: %s", reason(err));
        o->error = last_error();
      }
      return;
    }
  }
}

ssize_t SocketSource::read(const iovec *iov, int n) {
  for (;;) {
    msghdr m{};
    m.msg_iov = const_cast<iovec *>(iov);
    m.msg_iovlen = size_t(n);
    ssize_t r = recvmsg(fd_, &m, MSG_DONTWAIT);
    if (r >= 0) return r;
    if (errno == EINTR) continue;
    if ((errno == EAGAIN || errno == EWOULDBLOCK) && wait_ready(fd_, POLLIN, deadline_)) continue;
    fail(KVT_ERR_IO, "reading a reply failed: %s", reason(errno));
    return -1;
  }
}

}  // namespace kvt::remote
