#include "remote/resolve.hpp"

#include <sys/socket.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <system_error>
#include <thread>

#include "common/error.hpp"

namespace kvt::remote {
namespace {

std::atomic<size_t> g_running{0};
std::atomic<size_t> g_stuck{0};  // running with no caller waiting any more

// One lookup, shared by its caller and its thread: whichever leaves last frees it.
struct Lookup {
  std::mutex mu;
  std::condition_variable cv;
  std::string host, service;
  bool done = false;
  bool abandoned = false;
  int rc = 0;
  int err = 0;
  addrinfo *res = nullptr;
};

addrinfo stream_hints(int flags) {
  addrinfo h{};
  h.ai_family = AF_UNSPEC;
  h.ai_socktype = SOCK_STREAM;
  h.ai_flags = flags;
  return h;
}

kvt_status failed(const std::string &host, int rc, int err) {
  return fail(KVT_ERR_IO, "cannot connect: cannot resolve %s: %s", host.c_str(),
              rc == EAI_SYSTEM ? strerror(err) : gai_strerror(rc));
}

}  // namespace

Addresses &Addresses::operator=(Addresses &&o) noexcept {
  if (this != &o) {
    if (list_ != nullptr) freeaddrinfo(list_);
    list_ = o.list_;
    o.list_ = nullptr;
  }
  return *this;
}

Addresses::~Addresses() {
  if (list_ != nullptr) freeaddrinfo(list_);
}

size_t lookups_running() noexcept { return g_running.load(); }

kvt_status resolve(Addresses *out, const std::string &host, int port, Deadline d,
                   LookupFn lookup) {
  const std::string service = std::to_string(port);
  addrinfo *res = nullptr;
  const addrinfo numeric = stream_hints(AI_NUMERICHOST | AI_NUMERICSERV);
  if (getaddrinfo(host.c_str(), service.c_str(), &numeric, &res) == 0) {
    *out = Addresses(res);
    return KVT_OK;
  }
  if (g_stuck.load() >= kMaxStuckLookups)
    return fail(KVT_ERR_IO,
                "cannot connect: cannot resolve %s: %zu earlier lookups are still waiting for "
                "DNS (g4_timeout_us)", host.c_str(), kMaxStuckLookups);
  auto l = std::make_shared<Lookup>();
  l->host = host;
  l->service = service;
  ++g_running;
  try {
    std::thread([l, lookup] {
      const addrinfo hints = stream_hints(AI_NUMERICSERV);
      addrinfo *r = nullptr;
      const int rc = lookup(l->host.c_str(), l->service.c_str(), &hints, &r);
      const int err = errno;
      {
        std::lock_guard lk(l->mu);
        if (l->abandoned) {
          if (rc == 0 && r != nullptr) freeaddrinfo(r);
          --g_stuck;
        } else {
          l->rc = rc;
          l->err = err;
          l->res = rc == 0 ? r : nullptr;
          l->done = true;
        }
      }
      l->cv.notify_one();
      --g_running;
    }).detach();
  } catch (const std::system_error &e) {
    --g_running;
    return fail(KVT_ERR_IO, "cannot connect: cannot resolve %s: no thread for the lookup: %s",
                host.c_str(), e.what());
  }
  std::unique_lock lk(l->mu);
  if (!l->cv.wait_until(lk, d, [&] { return l->done; })) {
    l->abandoned = true;
    ++g_stuck;
    return fail(KVT_ERR_IO, "cannot connect: cannot resolve %s: timed out (g4_timeout_us)",
                host.c_str());
  }
  if (l->rc != 0) return failed(host, l->rc, l->err);
  *out = Addresses(l->res);
  return KVT_OK;
}

}  // namespace kvt::remote
