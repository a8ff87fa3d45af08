#include "metrics_server.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

namespace kvt::replay {

bool MetricsServer::start(uint16_t port, kvt_manager *m, kvt_connector *c, std::string *error) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
      bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) != 0 || listen(fd, 16) != 0) {
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
  stop_ = true;
  thread_.join();
  close(listen_fd_);
  listen_fd_ = -1;
}

void MetricsServer::run() {
  while (!stop_) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;  // wakes 10 times a second to see stop_
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    answer(fd);
    close(fd);
  }
}

// One request: GET /metrics, or a 404 / 405. A client that sends nothing for a second, or
// more than 8 KiB of header, is dropped.
void MetricsServer::answer(int fd) {
  std::string req;
  char b[1024];
  while (req.find("\r\n\r\n") == std::string::npos && req.size() < 8192) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 1000) <= 0) return;
    ssize_t n = read(fd, b, sizeof b);
    if (n <= 0) return;
    req.append(b, size_t(n));
  }
  std::string status = "200 OK", type = "text/plain; version=0.0.4; charset=utf-8", body;
  if (req.rfind("GET ", 0) != 0) {
    status = "405 Method Not Allowed";
    body = "only GET\n";
  } else if (req.rfind("GET /metrics ", 0) != 0 && req.rfind("GET /metrics?", 0) != 0) {
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
  std::string out = "HTTP/1.1 " + status + "\r\nContent-Type: " + type +
                    "\r\nContent-Length: " + std::to_string(body.size()) +
                    "\r\nConnection: close\r\n\r\n" + body;
  for (size_t done = 0; done < out.size();) {
    ssize_t n = send(fd, out.data() + done, out.size() - done, MSG_NOSIGNAL);
    if (n <= 0) return;
    done += size_t(n);
  }
}

}  // namespace kvt::replay
