#include "observe/endpoint.hpp"

#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstddef>
#include <cstring>

#include "common/error.hpp"
#include "common/log.hpp"
#include "observe/event_json.hpp"

namespace kvt::obs {
namespace {

// The timeline keeps the last kHistoryEvents of each of the last kHistoryRequests requests,
// and kHistoryTotal events in all (about 16 MiB): request ids are chosen by the engine's
// clients, so their number is not ours to trust.
constexpr size_t kHistoryEvents = 64, kHistoryRequests = 8192, kHistoryTotal = 1 << 17;
constexpr size_t kStreamEvents = 1 << 12;  // a subscribed client's queue; the oldest give way
constexpr size_t kAcceptsPerWake = 64;
constexpr uint64_t kAcceptRestNs = 200'000'000;  // after accept ran out of descriptors

uint64_t now_ns() noexcept {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000u + uint64_t(ts.tv_nsec);
}

// A reply line. Replies quote what clients and the engine sent (a parse error's bytes, request
// ids, which kvtier does not check): bytes that are not UTF-8 are replaced (U+FFFD) rather
// than thrown on, which would end the serving process from this thread.
std::string reply_line(const Json &j) { return json_line(j) + "\n"; }

}  // namespace

struct Endpoint::Client {
  int fd;
  std::string in, out;
  std::shared_ptr<Subscriber> sub;  // once it asked to subscribe
  uint64_t progress_ns;             // when out last shrank or was empty
  bool eof = false;                 // it shut its side: answer what came, send, then close
  bool closing = false;             // close once out is sent; out cleared: at once
};

void Endpoint::start_history(uint64_t now) {
  unwatched_since_ns_ = 0;
  if (recording_) return;
  bus_->subscribe(history_sub_);
  recording_ = true;
  history_since_ns_ = now;
}

// The history stops whole: a timeline with a hole in it would tell a story that did not happen.
void Endpoint::stop_history() noexcept {
  if (!recording_) return;
  bus_->unsubscribe(history_sub_.get());
  recording_ = false;
  kvt_obs_event ev[64];
  while (history_sub_->drain(ev, 64) != 0) {  // what it still held is not the next record's
  }
  history_.clear();
  history_order_.clear();
  history_events_ = 0;
}

void Endpoint::index_events() {
  if (!recording_) return;
  kvt_obs_event ev[256];
  while (size_t n = history_sub_->drain(ev, 256)) {
    for (size_t i = 0; i < n; ++i) {
      if (ev[i].req_id[0] == 0) continue;
      auto [it, fresh] = history_.try_emplace(ev[i].req_id);
      if (fresh) history_order_.push_back(it->first);
      Past p;
      std::memcpy(p.bytes, &ev[i], sizeof p.bytes);
      it->second.push_back(p);
      if (it->second.size() > kHistoryEvents) it->second.pop_front();
      else ++history_events_;
    }
    while (history_order_.size() > kHistoryRequests || history_events_ > kHistoryTotal) {
      auto it = history_.find(history_order_.front());
      history_events_ -= it->second.size();
      history_.erase(it);
      history_order_.pop_front();
    }
  }
}

Json Endpoint::timeline(const std::string &req_id, size_t n) const {
  Json out = Json::array();
  auto it = history_.find(req_id);
  if (it == history_.end()) return out;
  const auto &h = it->second;
  kvt_obs_event e{};
  std::memcpy(e.req_id, req_id.data(), std::min(req_id.size(), size_t{KVT_REQ_ID_MAX}));
  for (size_t i = h.size() > n ? h.size() - n : 0; i < h.size(); ++i) {
    std::memcpy(&e, h[i].bytes, sizeof h[i].bytes);
    out.push_back(event_json(e));
  }
  return out;
}

Endpoint::~Endpoint() {
  if (thread_.joinable()) {
    stop_ = true;
    uint64_t one = 1;
    [[maybe_unused]] ssize_t r = write(wake_fd_, &one, sizeof one);
    thread_.join();
  }
  stop_history();
  socket_.close();
  if (wake_fd_ >= 0) close(wake_fd_);
}

kvt_status Endpoint::open(const std::string &path, std::shared_ptr<Bus> bus, EndpointOps ops,
                          const EndpointLimits &limits) {
  if (limits.max_clients == 0 || limits.client_buffer == 0)
    return fail(KVT_ERR_INVALID_ARGUMENT, "an endpoint needs room for a client and its replies");
  if (kvt_status st = socket_.open(path, limits.access); st != KVT_OK) return st;
  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd_ < 0) {
    kvt_status st = fail(KVT_ERR_IO, "eventfd: %s", std::strerror(errno));
    socket_.close();
    return st;
  }
  limits_ = limits;
  bus_ = std::move(bus);
  // Made now, subscribed at a client's first request: nothing that can fail for want of a
  // descriptor happens then.
  history_sub_ = std::make_shared<Subscriber>(1 << 16);
  unwatched_since_ns_ = now_ns();
  ops_ = std::move(ops);
  thread_ = std::thread([this] { run(); });
  return KVT_OK;
}

EndpointStats Endpoint::stats() const noexcept {
  return {clients_.load(), refused_.load(), dropped_.load(), peak_buffered_.load()};
}

void Endpoint::answer(Client &c, std::string_view line) {
  try {
    start_history(now_ns());
  } catch (const std::exception &e) {  // no memory: served without a timeline
    log(KVT_LOG_WARN, "endpoint: cannot record the timeline: %s", e.what());
  }
  Json reply = Json::object(), req;
  std::string error;
  try {
    req = Json::parse(line);
  } catch (const std::exception &e) {
    error = std::string("malformed request: ") + e.what();
  }
  if (error.empty() && (!req.is_object() || !req.contains("cmd") || !req["cmd"].is_string()))
    error = "a request is a JSON object with a string \"cmd\"";
  if (error.empty()) {
    const std::string cmd = req["cmd"];
    const std::pair<const char *, const EndpointOps::Op *> table[] = {
        {"slots", &ops_.slots},     {"batches", &ops_.batches},
        {"tiers", &ops_.tiers},     {"break", &ops_.add_breakpoint},
        {"clear", &ops_.remove_breakpoint}, {"pause", &ops_.pause},
        {"resume", &ops_.resume},   {"paused", &ops_.paused},
        {"metrics", &ops_.metrics}};
    const EndpointOps::Op *op = nullptr;
    for (const auto &[name, o] : table)
      if (cmd == name) op = o;
    if (cmd == "timeline") {
      if (!req.contains("req_id") || !req["req_id"].is_string()) {
        error = "\"timeline\" needs a string \"req_id\"";
      } else {
        const size_t n = req.contains("n") && req["n"].is_number_unsigned()
                             ? req["n"].get<size_t>()
                             : kHistoryEvents;
        index_events();  // those emitted before this request was read
        reply["events"] = timeline(req["req_id"].get<std::string>(), n);
        reply["recorded_since_ns"] = history_since_ns_;
      }
    } else if (cmd == "subscribe") {
      try {
        if (!c.sub) {
          c.sub = std::make_shared<Subscriber>(kStreamEvents);
          bus_->subscribe(c.sub);
        }
      } catch (const std::exception &e) {
        error = e.what();
      }
    } else if (op == nullptr) {
      error = "unknown cmd '" + cmd +
              "' (slots, batches, tiers, break, clear, pause, resume, paused, metrics, "
              "timeline, subscribe)";
    } else if (!*op) {
      error = "'" + cmd + "' needs a connector with a scheduler half";
    } else {
      try {
        error = (*op)(req, &reply);
      } catch (const std::exception &e) {
        error = e.what();
      }
    }
  }
  reply["ok"] = error.empty();
  if (!error.empty()) reply["error"] = error;
  c.out += reply_line(reply);
}

void Endpoint::turn_away(int fd, const std::string &why) noexcept {
  ++refused_;
  try {
    const std::string line = reply_line({{"ok", false}, {"error", why}});
    [[maybe_unused]] ssize_t n = send(fd, line.data(), line.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  } catch (...) {  // no memory for the line: closed without it
  }
  close(fd);
}

void Endpoint::accept_clients(std::vector<std::unique_ptr<Client>> &clients, uint64_t now) {
  for (size_t i = 0; i < kAcceptsPerWake; ++i) {
    int fd = accept4(socket_.fd(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        // The pending connection stays queued and poll would report it at once: rest
        // instead of spinning, and let the host's own calls have the descriptors.
        if (accept_after_ns_ == 0)
          log(KVT_LOG_WARN, "endpoint: cannot accept a client: %s; retrying in %llu ms",
              std::strerror(errno), (unsigned long long)(kAcceptRestNs / 1000000));
        accept_after_ns_ = now + kAcceptRestNs;
      }
      return;
    }
    accept_after_ns_ = 0;
    std::string why;
    if (!socket_.admits(fd, &why)) {
      // Logged at the 1st, 2nd, 4th, 8th... refusal: visible, never a flood.
      if (std::has_single_bit(refused_.load() + 1))
        log(KVT_LOG_WARN, "endpoint: turned away a client: %s", why.c_str());
      turn_away(fd, why);
    } else if (clients.size() >= limits_.max_clients) {
      turn_away(fd, "too many clients (" + std::to_string(limits_.max_clients) +
                        "); try again later");
    } else {
      clients.push_back(std::make_unique<Client>(Client{fd, {}, {}, nullptr, now}));
    }
  }
}

void Endpoint::serve_client(Client &c, uint64_t now) {
  const size_t budget = limits_.client_buffer;
  // Read while its unread replies are within budget, a line's worth at most per wake: a
  // client that sends faster than it reads is held back by its own socket.
  while (!c.eof && !c.closing && c.out.size() < budget && c.in.size() <= kMaxLine) {
    char b[4096];
    ssize_t n = read(c.fd, b, sizeof b);
    if (n > 0) {
      c.in.append(b, size_t(n));
    } else if (n == 0) {
      c.eof = true;
    } else if (errno != EINTR) {
      if (errno != EAGAIN) c.closing = true, c.out.clear();
      break;
    }
  }
  size_t at = 0;
  for (size_t nl; !c.closing && c.out.size() < budget &&
                  (nl = c.in.find('\n', at)) != std::string::npos;
       at = nl + 1)
    try {
      answer(c, std::string_view(c.in).substr(at, nl - at));
    } catch (const std::exception &) {  // out of memory: this client goes, the engine stays
      c.closing = true;
      c.out.clear();
    }
  c.in.erase(0, at);
  const size_t first = std::min(c.in.find('\n'), c.in.size());
  if (!c.closing && first > kMaxLine) {
    c.out += reply_line({{"ok", false}, {"error", "request longer than 64 KiB"}});
    c.in.clear();
    c.closing = true;
    ++dropped_;
  }
  if (c.eof && c.in.find('\n') == std::string::npos) c.closing = true;
  if (c.sub && !c.closing) {
    kvt_obs_event ev[64];
    // A client that reads slowly is fed no faster: its queue drops the oldest events.
    while (c.out.size() < budget) {
      size_t n = c.sub->drain(ev, 64);
      if (n == 0) break;
      for (size_t i = 0; i < n; ++i) c.out += reply_line({{"event", event_json(ev[i])}});
    }
  }
  if (c.out.size() > peak_buffered_.load(std::memory_order_relaxed))
    peak_buffered_.store(c.out.size(), std::memory_order_relaxed);
  size_t sent = 0;
  while (sent < c.out.size()) {
    ssize_t n = send(c.fd, c.out.data() + sent, c.out.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += size_t(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      if (n < 0 && errno != EAGAIN) c.closing = true, c.out.clear(), sent = 0;
      break;
    }
  }
  c.out.erase(0, sent);
  if (sent > 0 || c.out.empty()) c.progress_ns = now;
  if (now - c.progress_ns > kStallNs) {  // it stopped reading
    c.closing = true;
    c.out.clear();
    ++dropped_;
  }
}

void Endpoint::serve(std::vector<std::unique_ptr<Client>> &clients) {
  index_events();
  uint64_t now = now_ns();
  const bool resting = accept_after_ns_ > now;
  std::vector<pollfd> fds = {{resting ? -1 : socket_.fd(), POLLIN, 0},
                             {wake_fd_, POLLIN, 0},
                             {recording_ ? history_sub_->fd() : -1, POLLIN, 0}};
  int timeout_ms = resting ? int(std::min<uint64_t>((accept_after_ns_ - now) / 1000000 + 1, 500))
                           : 500;
  if (recording_ && unwatched_since_ns_ != 0) {
    const uint64_t end = unwatched_since_ns_ + limits_.history_linger_ns;
    timeout_ms = std::min<int>(timeout_ms, end > now ? int((end - now) / 1000000 + 1) : 0);
  }
  for (const auto &c : clients) {
    const bool room = !c->closing && c->out.size() < limits_.client_buffer;
    const bool reads = room && !c->eof && c->in.size() <= kMaxLine;
    fds.push_back({c->fd, short((reads ? POLLIN : 0) | (c->out.empty() ? 0 : POLLOUT)), 0});
    if (c->sub && room) fds.push_back({c->sub->fd(), POLLIN, 0});
    if (room && c->in.find('\n') != std::string::npos) timeout_ms = 0;  // lines wait for room
  }
  if (poll(fds.data(), fds.size(), timeout_ms) < 0 && errno != EINTR) {
    log(KVT_LOG_ERROR, "endpoint: poll: %s", std::strerror(errno));
    poll(nullptr, 0, 100);  // whatever it is (no memory), not in a tight loop
    return;
  }
  now = now_ns();
  if (fds[0].revents & POLLIN || (resting && accept_after_ns_ <= now)) {
    accept_clients(clients, now);
    // Counted before any is served: a client that has its first reply is in the stats.
    clients_.store(clients.size());
  }
  for (auto &c : clients) serve_client(*c, now);
  std::erase_if(clients, [&](const std::unique_ptr<Client> &c) {
    if (!c->closing || !c->out.empty()) return false;
    if (c->sub) bus_->unsubscribe(c->sub.get());
    close(c->fd);
    return true;
  });
  clients_.store(clients.size(), std::memory_order_relaxed);
  if (!clients.empty()) return;
  if (unwatched_since_ns_ == 0) unwatched_since_ns_ = now;
  if (now - unwatched_since_ns_ >= limits_.history_linger_ns) stop_history();
}

void Endpoint::run() noexcept {
  pthread_setname_np(pthread_self(), "kvt-endpoint");  // for top -H, and the tests
  std::vector<std::unique_ptr<Client>> clients;
  while (!stop_) {
    try {
      serve(clients);
    } catch (const std::exception &e) {  // out of memory: the engine goes on, and is told
      log(KVT_LOG_ERROR, "endpoint: %s", e.what());
    }
  }
  for (auto &c : clients) {
    if (c->sub) bus_->unsubscribe(c->sub.get());
    close(c->fd);
  }
}

}  // namespace kvt::obs
