// The sockets of kvtier-router: a SUB per instance, and a DEALER per replay endpoint, read by
// one thread that hands every message to the Core and recovers gaps through replay, as
// vLLM's ZmqEventPublisher expects its subscribers to, and through a kvtier publisher's
// snapshot where replay cannot (docs/ROUTER.md): after a gap the replay buffer no longer
// holds, and at every (re)connection of the SUB, which is how a restart shows.
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
    zmq::socket_t monitor;  // the SUB's connections made (PAIR, from zmq_socket_monitor)
    std::unique_ptr<zmq::socket_t> dealer;
    std::chrono::steady_clock::time_point active;  // last message or resync
  };
  void run();
  void receive(Conn &c);
  // Asks c's replay socket for every message from `from`, hands them to the Core; false if
  // it has none or it did not finish answering in time.
  bool replay(Conn &c, uint64_t from);
  // Asks c's replay socket for a snapshot and hands it to the Core; false if it has none,
  // the publisher answered none (vLLM's: END_SEQ alone), or it did not finish in time.
  bool snapshot(Conn &c);
  // The SUB connected (first, or again after its publisher went away): a snapshot, or
  // without one, the catch-up replay of a first connection.
  void connected(Conn &c);
  // Sends a request's last frame to c's replay socket and hands each reply to `batch`;
  // true at END_SEQ, false on a timeout (the DEALER is then replaced).
  template <class Batch>
  bool ask(Conn &c, zmq::const_buffer request, Batch &&batch);

  Core &core_;
  const SubscriberOptions o_;
  zmq::context_t ctx_;
  std::vector<Conn> conns_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace kvt::router
