#include "observe/endpoint.hpp"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "common/error.hpp"
#include "observe/subscriber.hpp"

namespace kvt::obs {
namespace {

constexpr size_t kMaxLine = 64 << 10, kMaxBehind = 8 << 20, kStreamBehind = 1 << 20;
constexpr size_t kHistoryEvents = 64, kHistoryRequests = 8192;

nlohmann::json event_json(const kvt_obs_event &e) {
  nlohmann::json j = {{"seq", e.seq},       {"time_ns", e.time_ns},
                      {"kind", obs_kind_name(e.kind)}};
  if (e.req_id[0]) j["req_id"] = e.req_id;
  switch (e.kind) {
    case KVT_OBS_SLOT:
      j["from"] = e.prev;
      j["to"] = e.state;
      j["trigger"] = trigger_name(e.trigger);
      j["tokens"] = e.tokens;
      j["computed"] = e.computed;
      break;
    case KVT_OBS_CANDIDATE:
      j["state"] = candidate_name(e.state);
      j["batch"] = e.batch;
      j["src"] = e.src;
      j["dst"] = e.dst;
      j["blocks"] = e.blocks;
      break;
    case KVT_OBS_TRANSFER:
      j["src"] = e.src;
      j["dst"] = e.dst;
      j["status"] = kvt_status_str(e.status);
      j["blocks"] = e.blocks;
      j["bytes"] = e.bytes;
      j["duration_ns"] = e.duration_ns;
      break;
    case KVT_OBS_DROPPED:
      j["count"] = e.count;
      break;
    case KVT_OBS_CALL:
      j["trigger"] = trigger_name(e.trigger);
      j["status"] = kvt_status_str(e.status);
      j["tokens"] = e.tokens;
      j["computed"] = e.computed;
      j["blocks"] = e.blocks;
      j["result"] = e.count;
      break;
    default:
      j["tier"] = e.dst;
      j["hash"] = e.hash;
  }
  return j;
}

}  // namespace

struct Endpoint::Client {
  int fd;
  std::string in, out;
  std::shared_ptr<Subscriber> sub;  // once it asked to subscribe
  bool closing = false;             // after the reply that refuses an over-long line
};

void Endpoint::index_events() {
  kvt_obs_event ev[256];
  while (size_t n = history_sub_->drain(ev, 256)) {
    for (size_t i = 0; i < n; ++i) {
      if (ev[i].req_id[0] == 0) continue;
      auto [it, fresh] = history_.try_emplace(ev[i].req_id);
      if (fresh) history_order_.push_back(it->first);
      it->second.push_back(ev[i]);
      if (it->second.size() > kHistoryEvents) it->second.pop_front();
    }
    while (history_order_.size() > kHistoryRequests) {
      history_.erase(history_order_.front());
      history_order_.pop_front();
    }
  }
}

nlohmann::json Endpoint::timeline(const std::string &req_id, size_t n) const {
  nlohmann::json out = nlohmann::json::array();
  auto it = history_.find(req_id);
  if (it == history_.end()) return out;
  const auto &h = it->second;
  for (size_t i = h.size() > n ? h.size() - n : 0; i < h.size(); ++i)
    out.push_back(event_json(h[i]));
  return out;
}

Endpoint::~Endpoint() {
  if (history_sub_) bus_->unsubscribe(history_sub_.get());
  if (thread_.joinable()) {
    stop_ = true;
    uint64_t one = 1;
    [[maybe_unused]] ssize_t r = write(wake_fd_, &one, sizeof one);
    thread_.join();
  }
  if (listen_fd_ >= 0) {
    close(listen_fd_);
    unlink(path_.c_str());
  }
  if (wake_fd_ >= 0) close(wake_fd_);
}

kvt_status Endpoint::open(const std::string &path, std::shared_ptr<Bus> bus, EndpointOps ops) {
  sockaddr_un a{};
  if (path.empty() || path.size() >= sizeof a.sun_path)
    return fail(KVT_ERR_INVALID_ARGUMENT, "socket path '%s' is empty or longer than %zu bytes",
                path.c_str(), sizeof a.sun_path - 1);
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path, path.c_str(), path.size());
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) != 0 || listen(fd, 16) != 0) {
    kvt_status st = fail(KVT_ERR_IO, "cannot listen on '%s': %s", path.c_str(),
                         std::strerror(errno));
    if (fd >= 0) close(fd);
    return st;
  }
  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd_ < 0) {
    close(fd);
    unlink(path.c_str());
    return fail(KVT_ERR_IO, "eventfd: %s", std::strerror(errno));
  }
  path_ = path;
  listen_fd_ = fd;
  bus_ = std::move(bus);
  history_sub_ = std::make_shared<Subscriber>(1 << 16);
  bus_->subscribe(history_sub_);
  ops_ = std::move(ops);
  thread_ = std::thread([this] { run(); });
  return KVT_OK;
}

namespace {
// A reply line. Replies quote what clients and the engine sent (a parse error's bytes, request
// ids, which kvtier does not check): bytes that are not UTF-8 are replaced (U+FFFD) rather
// than thrown on, which would end the serving process from this thread.
std::string reply_line(const nlohmann::json &j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}
}  // namespace

void Endpoint::run() {
  std::vector<std::unique_ptr<Client>> clients;
  auto answer = [&](Client &c, const std::string &line) {
    nlohmann::json reply = nlohmann::json::object(), req;
    std::string error;
    try {
      req = nlohmann::json::parse(line);
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
          reply["events"] = timeline(req["req_id"].get<std::string>(), n);
        }
      } else if (cmd == "subscribe") {
        try {
          if (!c.sub) {
            c.sub = std::make_shared<Subscriber>(1 << 16);
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
  };

  std::vector<pollfd> fds;
  while (!stop_) {
    index_events();
    fds.assign({{listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}, {history_sub_->fd(), POLLIN, 0}});
    for (const auto &c : clients) {
      fds.push_back({c->fd, short(POLLIN | (c->out.empty() ? 0 : POLLOUT)), 0});
      if (c->sub) fds.push_back({c->sub->fd(), POLLIN, 0});
    }
    if (poll(fds.data(), fds.size(), 500) < 0 && errno != EINTR) break;
    if (fds[0].revents & POLLIN) {
      int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd >= 0) clients.push_back(std::make_unique<Client>(Client{fd, {}, {}, nullptr}));
    }
    for (auto &c : clients) {
      char b[4096];
      for (;;) {  // read what is there
        ssize_t n = read(c->fd, b, sizeof b);
        if (n > 0) {
          c->in.append(b, size_t(n));
          continue;
        }
        if (n == 0 || (errno != EAGAIN && errno != EINTR)) c->closing = true, c->out.clear();
        break;
      }
      for (size_t nl; !c->closing && (nl = c->in.find('\n')) != std::string::npos;) {
        try {
          answer(*c, c->in.substr(0, nl));
        } catch (const std::exception &) {  // out of memory: this client goes, the engine stays
          c->closing = true;
          c->out.clear();
        }
        c->in.erase(0, nl + 1);
      }
      if (c->in.size() > kMaxLine) {
        c->out += reply_line({{"ok", false}, {"error", "request longer than 64 KiB"}});
        c->in.clear();
        c->closing = true;
      }
      if (c->sub) {
        kvt_obs_event ev[64];
        // A client that reads slowly is fed no faster: its queue drops the oldest events.
        while (c->out.size() < kStreamBehind) {
          size_t n = c->sub->drain(ev, 64);
          if (n == 0) break;
          for (size_t i = 0; i < n; ++i)
            c->out += reply_line({{"event", event_json(ev[i])}});
        }
      }
      while (!c->out.empty()) {
        ssize_t n = send(c->fd, c->out.data(), c->out.size(), MSG_NOSIGNAL);
        if (n > 0) {
          c->out.erase(0, size_t(n));
          continue;
        }
        if (n < 0 && errno != EAGAIN && errno != EINTR) c->closing = true, c->out.clear();
        break;
      }
      if (c->out.size() > kMaxBehind) c->closing = true, c->out.clear();  // it stopped reading
    }
    std::erase_if(clients, [&](const std::unique_ptr<Client> &c) {
      if (!c->closing || !c->out.empty()) return false;
      if (c->sub) bus_->unsubscribe(c->sub.get());
      close(c->fd);
      return true;
    });
  }
  for (auto &c : clients) {
    if (c->sub) bus_->unsubscribe(c->sub.get());
    close(c->fd);
  }
}

}  // namespace kvt::obs
