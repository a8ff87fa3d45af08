// --metrics-port: kvt_metrics_text served at http://127.0.0.1:PORT/metrics (Prometheus, curl)
// from a thread of its own until stopped. The thread polls every client at once, and each
// request has a whole-request deadline, so idle or dripping clients cannot starve a scrape.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "kvtier.h"

namespace kvt::replay {

class MetricsServer {
 public:
  // What one client may cost. At the cap, a new connection closes the oldest one still
  // sending its request (else the oldest one), so a flood cannot lock a scrape out.
  static constexpr size_t kMaxClients = 64;
  static constexpr size_t kMaxHead = 8192;  // request line and headers, with the blank line
  static constexpr std::chrono::milliseconds kHeadDeadline{2000};   // from accept
  static constexpr std::chrono::milliseconds kReplyDeadline{5000};  // from the whole head
  // accept() out of descriptors: the listener rests this long instead of spinning.
  static constexpr std::chrono::milliseconds kAcceptBackoff{100};

  ~MetricsServer() { stop(); }
  // Listens on 127.0.0.1:port; c may be NULL (blocks mode).
  bool start(uint16_t port, kvt_manager *m, kvt_connector *c, std::string *error);
  void stop();  // before m and c go; prompt: it wakes the thread

 private:
  using Clock = std::chrono::steady_clock;
  struct Client {
    int fd;
    Clock::time_point deadline;
    std::string in;   // the request head so far; empty once answered
    std::string out;  // the reply; empty while the head is incomplete
    size_t sent = 0;
  };

  void run();
  void accept_clients(std::vector<Client> *clients, Clock::time_point *rest_until);
  bool serve(Client *c);  // false: done with, or failed; close it
  std::string reply(const std::string &head) const;

  kvt_manager *m_ = nullptr;
  kvt_connector *c_ = nullptr;
  int listen_fd_ = -1;
  int wake_fd_ = -1;  // an eventfd that stop() makes readable
  std::thread thread_;
};

}  // namespace kvt::replay
