#include "subscriber.hpp"

#include <chrono>

#include <zmq_addon.hpp>

namespace kvt::router {

namespace {

std::unique_ptr<zmq::socket_t> open_dealer(zmq::context_t &ctx, const std::string &endpoint) {
  auto d = std::make_unique<zmq::socket_t>(ctx, zmq::socket_type::dealer);
  d->set(zmq::sockopt::linger, 0);
  d->set(zmq::sockopt::rcvhwm, 0);  // a replay's replies all come at once
  d->connect(endpoint);
  return d;
}

}  // namespace

bool parse_instance(const std::string &arg, InstanceSpec *out, std::string *error) {
  size_t eq = arg.find('=');
  if (eq == 0 || eq == std::string::npos || eq + 1 == arg.size()) {
    *error = "--instance takes NAME=SUB_ENDPOINT[,REPLAY_ENDPOINT], not \"" + arg + "\"";
    return false;
  }
  out->name = arg.substr(0, eq);
  std::string rest = arg.substr(eq + 1);
  size_t comma = rest.find(',');
  out->sub = rest.substr(0, comma);
  out->replay = comma == std::string::npos ? "" : rest.substr(comma + 1);
  if (out->sub.empty() || (comma != std::string::npos && out->replay.empty())) {
    *error = "--instance \"" + arg + "\": an endpoint is empty";
    return false;
  }
  return true;
}

bool Subscriber::add(const InstanceSpec &spec, std::string *error) {
  try {
    zmq::socket_t sub(ctx_, zmq::socket_type::sub);
    sub.set(zmq::sockopt::linger, 0);
    sub.set(zmq::sockopt::rcvhwm, o_.rcvhwm);
    sub.set(zmq::sockopt::subscribe, o_.topic);
    // The mirror of vLLM's rule for its PUB: a publisher that connects needs us to bind.
    if (spec.sub.find('*') != std::string::npos) sub.bind(spec.sub);
    else sub.connect(spec.sub);
    const std::string mon = "inproc://kvtier-router-monitor-" + std::to_string(conns_.size());
    if (zmq_socket_monitor(sub.handle(), mon.c_str(), ZMQ_EVENT_CONNECTED | ZMQ_EVENT_ACCEPTED))
      throw zmq::error_t();
    zmq::socket_t monitor(ctx_, zmq::socket_type::pair);
    monitor.set(zmq::sockopt::linger, 0);
    monitor.connect(mon);
    std::unique_ptr<zmq::socket_t> dealer;
    if (!spec.replay.empty()) dealer = open_dealer(ctx_, spec.replay);
    size_t inst = core_.add_instance(spec.name);
    conns_.push_back(Conn{inst, spec.replay, std::move(sub), std::move(monitor),
                          std::move(dealer), std::chrono::steady_clock::now()});
    return true;
  } catch (const zmq::error_t &e) {
    *error = "instance " + spec.name + ": " + e.what();
    return false;
  }
}

void Subscriber::start() { thread_ = std::thread(&Subscriber::run, this); }

void Subscriber::stop() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

void Subscriber::run() {
  std::vector<zmq::pollitem_t> items;
  for (Conn &c : conns_) {
    items.push_back({c.sub.handle(), 0, ZMQ_POLLIN, 0});
    items.push_back({c.monitor.handle(), 0, ZMQ_POLLIN, 0});
  }
  while (!stop_) {
    zmq::poll(items, std::chrono::milliseconds(50));
    const auto now = std::chrono::steady_clock::now();
    for (size_t i = 0; i < conns_.size(); ++i) {
      Conn &c = conns_[i];
      const bool message = items[2 * i].revents & ZMQ_POLLIN;
      if (message) {
        c.active = now;
        receive(c);
      }
      if (items[2 * i + 1].revents & ZMQ_POLLIN) {
        // Each event is two frames: its number and value, then the endpoint.
        std::vector<zmq::message_t> event;
        while (zmq::recv_multipart(c.monitor, std::back_inserter(event),
                                   zmq::recv_flags::dontwait))
          event.clear();
        c.active = now;
        receive(c);  // what the old connection left first
        connected(c);
      } else if (!message && c.dealer && o_.resync_ms > 0 &&
                 now - c.active >= std::chrono::milliseconds(o_.resync_ms)) {
        c.active = now;
        if (!core_.stale(c.inst) || !snapshot(c)) replay(c, core_.resync(c.inst));
      }
    }
  }
}

void Subscriber::connected(Conn &c) {
  if (snapshot(c)) return;
  // Joining a running vLLM instance: what it holds already comes from its replay buffer.
  if (std::optional<uint64_t> from = core_.catch_up(c.inst); from && replay(c, *from))
    core_.caught_up(c.inst);
}

void Subscriber::receive(Conn &c) {
  // A bounded drain, so that one busy instance does not starve the others.
  for (int k = 0; k < 256; ++k) {
    std::vector<zmq::message_t> msg;
    if (!zmq::recv_multipart(c.sub, std::back_inserter(msg), zmq::recv_flags::dontwait)) return;
    std::vector<std::string_view> frames;
    for (const zmq::message_t &m : msg) frames.push_back(m.to_string_view());
    std::optional<uint64_t> gap = core_.deliver(c.inst, frames);
    if (!gap) continue;
    const bool applied = replay(c, *gap) && !core_.deliver(c.inst, frames);
    if (applied && !core_.stale(c.inst)) continue;
    // Replay did not fill the gap. A snapshot also covers this message, which was
    // published before the snapshot was asked for; without one, the message is applied
    // over the gap.
    if (!applied) core_.replay_missed(c.inst);
    if (!snapshot(c) && !applied) core_.deliver(c.inst, frames);
  }
}

template <class Batch>
bool Subscriber::ask(Conn &c, zmq::const_buffer request, Batch &&batch) {
  if (!c.dealer) return false;
  try {
    // A DEALER speaks to a ROUTER as REQ does: an empty delimiter frame first.
    c.dealer->send(zmq::message_t(), zmq::send_flags::sndmore);
    c.dealer->send(request);
    const auto deadline = std::chrono::milliseconds(o_.replay_timeout_ms);
    for (;;) {
      zmq::pollitem_t item{c.dealer->handle(), 0, ZMQ_POLLIN, 0};
      if (zmq::poll(&item, 1, deadline) == 0 || stop_) break;
      std::vector<zmq::message_t> msg;
      if (!zmq::recv_multipart(*c.dealer, std::back_inserter(msg))) break;
      std::vector<std::string_view> frames;
      for (const zmq::message_t &m : msg) frames.push_back(m.to_string_view());
      // A bad reply is counted and skipped.
      ReplayReply r = replay_reply(frames);
      if (r.kind == ReplayReply::End) return true;
      if (r.kind == ReplayReply::Bad) core_.bad_reply(c.inst, std::move(r.why));
      else batch(r);
    }
  } catch (const zmq::error_t &) {
  }
  // No end marker in time: replies still on the way would answer a later request, so the
  // socket is replaced.
  c.dealer = open_dealer(ctx_, c.replay_endpoint);
  return false;
}

bool Subscriber::replay(Conn &c, uint64_t from) {
  char seq[8];
  for (int i = 0; i < 8; ++i) seq[i] = char(from >> (56 - 8 * i));
  return ask(c, zmq::buffer(seq, 8),
             [&](const ReplayReply &r) { core_.deliver_replayed(c.inst, r.seq, r.payload); });
}

bool Subscriber::snapshot(Conn &c) {
  std::optional<uint64_t> next;  // every message of the answer carries it
  bool whole = true;
  const bool ended = ask(c, zmq::buffer(kSnapshotRequest), [&](const ReplayReply &r) {
    if (next && *next != r.seq) {
      core_.bad_reply(c.inst, "a snapshot's messages with two sequence numbers");
      whole = false;
      return;
    }
    next = r.seq;
    core_.deliver_snapshot(c.inst, r.payload);
  });
  if (!next) return false;  // none to be had
  if (ended && whole) core_.end_snapshot(c.inst, *next);
  else core_.snapshot_failed(c.inst);  // the index holds part of one
  return ended && whole;
}

}  // namespace kvt::router
