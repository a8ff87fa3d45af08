// The management endpoint: a Unix-domain socket that speaks one JSON object per line
// (docs/EVENTS.md, "The management endpoint"). Requests list slots, batches and tiers, set
// and clear breakpoints, pause and resume, return metrics, or turn the connection into a
// stream of events. It knows the connector only through the callbacks it is given, so that
// observe/ stays below connector/. One thread serves every client; a bad request gets an
// error reply, and what one client costs is bounded (docs/SECURITY.md): a number of
// clients, a line length, a budget of replies it has not read, after which its requests
// wait, and a deadline for reading them. It keeps the last events of recent requests for
// "timeline" from a client's first request until a while after the last client left: an
// engine that nobody watches pays nothing for its endpoint, as the bus stays off.
#pragma once

#include <atomic>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "observe/bus.hpp"
#include "observe/socket_file.hpp"
#include "observe/subscriber.hpp"

namespace kvt::obs {

// Requests and replies keep their keys in the order they were written.
using Json = nlohmann::ordered_json;

struct EndpointOps {
  // Each answers one request: fills *reply (its "ok" is set by the endpoint) or returns an
  // error message. Called on the endpoint's thread.
  using Op = std::function<std::string(const Json &req, Json *reply)>;
  Op slots, batches, tiers, add_breakpoint, remove_breakpoint, pause, resume, paused,
      metrics;
};

struct EndpointLimits {
  SocketAccess access;
  size_t max_clients = 64;              // more are answered "too many clients" and closed
  size_t client_buffer = size_t{256} << 10;  // unread replies before a client's requests wait
  // How long the timeline's history goes on being recorded after the last client left, so
  // that a console or a script that reconnects finds the requests it saw whole.
  uint64_t history_linger_ns = 600'000'000'000;
};

struct EndpointStats {
  uint64_t clients;        // connected now
  uint64_t refused;        // turned away: over the limit, or not an allowed user
  uint64_t dropped;        // closed for a line too long or replies left unread too long
  uint64_t peak_buffered;  // the most reply bytes one client has had waiting
};

class Endpoint {
 public:
  ~Endpoint();
  // Binds path (see SocketFile::open) and starts serving; the error set on failure.
  kvt_status open(const std::string &path, std::shared_ptr<Bus> bus, EndpointOps ops,
                  const EndpointLimits &limits = {});
  EndpointStats stats() const noexcept;

  static constexpr size_t kMaxLine = 64 << 10;
  // A client whose replies stay unread, without a byte taken, this long is closed.
  static constexpr uint64_t kStallNs = 30'000'000'000;

 private:
  struct Client;
  // An event without its request id, which the history's key holds (req_id is the last field).
  struct Past {
    unsigned char bytes[offsetof(kvt_obs_event, req_id)];
  };
  void run() noexcept;
  void serve(std::vector<std::unique_ptr<Client>> &clients);
  void accept_clients(std::vector<std::unique_ptr<Client>> &clients, uint64_t now);
  void turn_away(int fd, const std::string &why) noexcept;
  void serve_client(Client &c, uint64_t now);
  void answer(Client &c, std::string_view line);
  void start_history(uint64_t now);
  void stop_history() noexcept;
  void index_events();  // the timeline's per-request history, from history_sub_
  Json timeline(const std::string &req_id, size_t n) const;

  SocketFile socket_;
  EndpointLimits limits_;
  int wake_fd_ = -1;
  std::shared_ptr<Bus> bus_;
  EndpointOps ops_;
  // Subscribed while the history is recorded; the endpoint's thread alone touches it,
  // recording_ and the history below once the thread runs.
  std::shared_ptr<Subscriber> history_sub_;
  bool recording_ = false;
  uint64_t history_since_ns_ = 0;  // when recording began (CLOCK_MONOTONIC, as event times)
  uint64_t unwatched_since_ns_ = 0;  // when the last client left; 0 while one is connected
  // The last events of each request (without their id, the map's key), the requests in the
  // order they were first seen, and the events held in all.
  std::unordered_map<std::string, std::deque<Past>> history_;
  std::deque<std::string> history_order_;
  size_t history_events_ = 0;
  uint64_t accept_after_ns_ = 0;  // after EMFILE and the like: the listener rests until then
  std::atomic<uint64_t> clients_{0}, refused_{0}, dropped_{0}, peak_buffered_{0};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace kvt::obs
