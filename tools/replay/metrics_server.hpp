// --metrics-port: kvt_metrics_text served at http://127.0.0.1:PORT/metrics (Prometheus, curl)
// from a thread of its own, one connection at a time, until stopped.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>

#include "kvtier.h"

namespace kvt::replay {

class MetricsServer {
 public:
  ~MetricsServer() { stop(); }
  // Listens on 127.0.0.1:port; c may be NULL (blocks mode).
  bool start(uint16_t port, kvt_manager *m, kvt_connector *c, std::string *error);
  void stop();  // before m and c go

 private:
  void run();
  void answer(int fd);

  kvt_manager *m_ = nullptr;
  kvt_connector *c_ = nullptr;
  int listen_fd_ = -1;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace kvt::replay
