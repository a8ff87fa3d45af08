// The management endpoint: a Unix-domain socket that speaks one JSON object per line
// (docs/EVENTS.md, "The management endpoint"). Requests list slots, batches and tiers, set
// and clear breakpoints, pause and resume, return metrics, or turn the connection into a
// stream of events. It knows the connector only through the callbacks it is given, so that
// observe/ stays below connector/. One thread serves every client; a bad request gets an
// error reply, a client that stops reading loses events (a DROPPED marker says how many),
// and neither stops the others. It keeps the last events of recent requests for "timeline".
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "observe/bus.hpp"
#include "observe/subscriber.hpp"

namespace kvt::obs {

struct EndpointOps {
  // Each answers one request: fills *reply (its "ok" is set by the endpoint) or returns an
  // error message. Called on the endpoint's thread.
  using Op = std::function<std::string(const nlohmann::json &req, nlohmann::json *reply)>;
  Op slots, batches, tiers, add_breakpoint, remove_breakpoint, pause, resume, paused,
      metrics;
};

class Endpoint {
 public:
  ~Endpoint();
  // Binds path (which must not exist) and starts serving; the error set on failure.
  kvt_status open(const std::string &path, std::shared_ptr<Bus> bus, EndpointOps ops);

 private:
  struct Client;
  void run();
  void index_events();  // the timeline's per-request history, from history_sub_
  nlohmann::json timeline(const std::string &req_id, size_t n) const;

  std::string path_;
  int listen_fd_ = -1, wake_fd_ = -1;
  std::shared_ptr<Bus> bus_;
  EndpointOps ops_;
  std::shared_ptr<Subscriber> history_sub_;
  // The last events of each request, the requests in the order they were last seen.
  std::unordered_map<std::string, std::deque<kvt_obs_event>> history_;
  std::deque<std::string> history_order_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace kvt::obs
