// One Redis endpoint and its idle connections. Callers borrow a connection for one pipelined
// exchange, so threads talk to a shard in parallel. A failure closes the connection and
// retires every idle one (they reach the same dead server); the next call connects again.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kvtier.h"
#include "remote/connection.hpp"
#include "remote/endpoint.hpp"

namespace kvt::remote {

class Shard {
 public:
  Shard(Endpoint e, const std::string &password, uint64_t timeout_us,
        std::atomic<uint64_t> &reconnects)
      : endpoint_(std::move(e)),
        password_(password),
        timeout_us_(timeout_us),
        reconnects_(reconnects) {}

  const Endpoint &endpoint() const { return endpoint_; }
  // An idle connection, or a new one. KVT_ERR_IO when the shard cannot be reached.
  kvt_status acquire(std::unique_ptr<Connection> *out);
  // Gives c back: kept for reuse when ok, else closed along with the idle ones.
  void release(std::unique_ptr<Connection> c, bool ok);

 private:
  static constexpr size_t kMaxIdle = 16;

  const Endpoint endpoint_;
  const std::string &password_;
  const uint64_t timeout_us_;
  std::atomic<uint64_t> &reconnects_;
  std::mutex mu_;
  std::vector<std::unique_ptr<Connection>> idle_;  // guarded by mu_
  uint64_t epoch_ = 0;                             // guarded by mu_: + 1 per failure
  bool failed_ = false;                            // guarded by mu_: since the last connect
};

}  // namespace kvt::remote
