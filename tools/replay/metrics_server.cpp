#include "metrics_server.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>

namespace kvt::replay {

bool MetricsServer::start(uint16_t port, kvt_manager *m, kvt_connector *c, std::string *error) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  int one = 1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
      bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) != 0 ||
      listen(fd, int(kMaxClients)) != 0 ||
      (wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) < 0) {
    *error = "--metrics-port " + std::to_string(port) + ": " + std::strerror(errno);
    if (fd >= 0) close(fd);
    return false;
  }
  m_ = m;
  c_ = c;
  listen_fd_ = fd;
  thread_ = std::thread([this] { run(); });
  return true;
}

void MetricsServer::stop() {
  if (!thread_.joinable()) return;
  uint64_t one = 1;
  [[maybe_unused]] ssize_t r = write(wake_fd_, &one, sizeof one);  // our fd, never full
  thread_.join();
  close(listen_fd_);
  close(wake_fd_);
  listen_fd_ = wake_fd_ = -1;
}

void MetricsServer::run() {
  std::vector<Client> clients;
  std::vector<pollfd> fds;
  Clock::time_point rest_until{};
  for (;;) {
    Clock::time_point now = Clock::now(), next = Clock::time_point::max();
    bool resting = now < rest_until;
    if (resting) next = rest_until;
    // A negative fd is skipped by poll(): a resting listener is not watched.
    fds.assign({{wake_fd_, POLLIN, 0}, {resting ? -1 : listen_fd_, POLLIN, 0}});
    for (const Client &c : clients) {
      fds.push_back({c.fd, short(c.out.empty() ? POLLIN : POLLOUT), 0});
      next = std::min(next, c.deadline);
    }
    int timeout = -1;  // nothing to time out: only a client or stop() wakes it
    if (next != Clock::time_point::max())
      timeout = int(std::max<int64_t>(
          0, std::chrono::ceil<std::chrono::milliseconds>(next - now).count()));
    if (poll(fds.data(), fds.size(), timeout) < 0) {
      if (errno != EINTR) std::this_thread::sleep_for(kAcceptBackoff);  // ENOMEM: no spin
      continue;
    }
    if (fds[0].revents) break;
    now = Clock::now();
    for (size_t i = 0; i < clients.size(); ++i) {
      Client &c = clients[i];
      bool keep = c.deadline > now && (!fds[i + 2].revents || serve(&c));
      if (!keep) {
        close(c.fd);
        c.fd = -1;
      }
    }
    std::erase_if(clients, [](const Client &c) { return c.fd < 0; });
    if (fds[1].revents) accept_clients(&clients, &rest_until);
  }
  for (const Client &c : clients) close(c.fd);
}

void MetricsServer::accept_clients(std::vector<Client> *clients, Clock::time_point *rest_until) {
  // At most a cap's worth per wake, so that the clients already here are served too.
  for (size_t n = 0; n < kMaxClients; ++n) {
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      // Out of descriptors or memory: the pending connection stays, so polling the listener
      // again at once would spin; rest it while the clients here finish and free theirs.
      if (errno != EAGAIN && errno != EWOULDBLOCK) *rest_until = Clock::now() + kAcceptBackoff;
      return;
    }
    if (clients->size() >= kMaxClients) {
      auto oldest = std::find_if(clients->begin(), clients->end(),
                                 [](const Client &c) { return c.out.empty(); });
      if (oldest == clients->end()) oldest = clients->begin();
      close(oldest->fd);
      clients->erase(oldest);
    }
    clients->push_back({fd, Clock::now() + kHeadDeadline, {}, {}});
  }
}

bool MetricsServer::serve(Client *c) {
  if (c->out.empty()) {
    char b[kMaxHead];
    ssize_t n = read(c->fd, b, kMaxHead - c->in.size());  // the head never outgrows kMaxHead
    if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
    if (n == 0) return false;
    size_t from = c->in.size() < 3 ? 0 : c->in.size() - 3;
    c->in.append(b, size_t(n));
    if (c->in.find("\r\n\r\n", from) == std::string::npos) return c->in.size() < kMaxHead;
    c->out = reply(c->in);
    std::string().swap(c->in);
    c->deadline = Clock::now() + kReplyDeadline;
  }
  ssize_t n = send(c->fd, c->out.data() + c->sent, c->out.size() - c->sent, MSG_NOSIGNAL);
  if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
  c->sent += size_t(n);
  return c->sent < c->out.size();
}

// GET /metrics (or /metrics?...): 200 with the text; another path 404, another method 405.
std::string MetricsServer::reply(const std::string &head) const {
  std::string status = "200 OK", type = "text/plain; version=0.0.4; charset=utf-8", body;
  if (head.rfind("GET ", 0) != 0) {
    status = "405 Method Not Allowed";
    body = "only GET\n";
  } else if (head.rfind("GET /metrics ", 0) != 0 && head.rfind("GET /metrics?", 0) != 0) {
    status = "404 Not Found";
    body = "kvtier-replay serves /metrics only\n";
  } else {
    size_t len = 0;
    kvt_metrics_text(nullptr, 0, &len, m_, c_);
    std::vector<char> text(len + 4096);  // room for what happens in between
    if (kvt_metrics_text(text.data(), text.size(), &len, m_, c_) == KVT_OK) {
      body.assign(text.data(), len);
    } else {
      status = "500 Internal Server Error";
      body = std::string(kvt_last_error()) + "\n";
    }
  }
  return "HTTP/1.1 " + status + "\r\nContent-Type: " + type +
         "\r\nContent-Length: " + std::to_string(body.size()) +
         "\r\nConnection: close\r\n\r\n" + body;
}

}  // namespace kvt::replay
