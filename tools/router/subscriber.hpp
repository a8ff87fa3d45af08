// The sockets of kvtier-router: a SUB per instance, and a DEALER per replay endpoint, read by
// one thread that hands every message to the Core and recovers gaps through replay, as
// vLLM's ZmqEventPublisher expects its subscribers to.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <zmq.hpp>

#include "core.hpp"

namespace kvt::router {

struct InstanceSpec {
  std::string name;
  std::string sub;     // the publisher's endpoint: connected, or bound when it has a '*'
  std::string replay;  // its replay (ROUTER) endpoint; empty: gaps are not recovered
};

// Parses "NAME=SUB[,REPLAY]"; false with *error on a bad one.
bool parse_instance(const std::string &arg, InstanceSpec *out, std::string *error);

struct SubscriberOptions {
  std::string topic;          // SUB prefix filter ("" takes every message)
  int rcvhwm = 100000;        // messages queued per SUB before ZMQ drops, vLLM's PUB hwm
  int replay_timeout_ms = 1000;  // the longest wait for one replay reply
  int resync_ms = 1000;       // an instance quiet this long is asked for what follows; 0: never
};

class Subscriber {
 public:
  Subscriber(Core &core, SubscriberOptions o) : core_(core), o_(std::move(o)) {}
  ~Subscriber() { stop(); }

  // Adds the instance to the Core and opens its sockets; false with *error if ZMQ refuses
  // an endpoint. Before start only.
  bool add(const InstanceSpec &spec, std::string *error);
  void start();
  void stop();

 private:
  struct Conn {
    size_t inst;
    std::string replay_endpoint;
    zmq::socket_t sub;
    std::unique_ptr<zmq::socket_t> dealer;
    std::chrono::steady_clock::time_point active;  // last message or resync
  };
  void run();
  void receive(Conn &c);
  // Asks c's replay socket for every message from `from`, hands them to the Core; false if
  // it has none or it did not finish answering in time.
  bool replay(Conn &c, uint64_t from);

  Core &core_;
  const SubscriberOptions o_;
  zmq::context_t ctx_;
  std::vector<Conn> conns_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace kvt::router
