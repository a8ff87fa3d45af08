// Host names to addresses by a deadline. getaddrinfo has none of its own: a DNS server that
// never answers holds its caller for resolv.conf's timeout times its attempts, and G4's
// names come from the config and from the cluster's own answers (CLUSTER SLOTS, MOVED).
#pragma once

#include <netdb.h>

#include <chrono>
#include <cstddef>
#include <string>

#include "kvtier.h"

namespace kvt::remote {

using Deadline = std::chrono::steady_clock::time_point;

// getaddrinfo's signature: resolve() takes another lookup only in tests.
using LookupFn = int (*)(const char *host, const char *service, const addrinfo *hints,
                         addrinfo **res);

// getaddrinfo's answer, freed with it.
class Addresses {
 public:
  Addresses() = default;
  explicit Addresses(addrinfo *list) : list_(list) {}
  Addresses(Addresses &&o) noexcept : list_(o.list_) { o.list_ = nullptr; }
  Addresses &operator=(Addresses &&o) noexcept;
  Addresses(const Addresses &) = delete;
  Addresses &operator=(const Addresses &) = delete;
  ~Addresses();
  const addrinfo *get() const { return list_; }

 private:
  addrinfo *list_ = nullptr;
};

// At most this many lookups run past their callers' deadlines at once; a name that would
// start one more fails at once.
inline constexpr size_t kMaxStuckLookups = 16;

// The stream addresses of host:port. A numeric address is converted at once; a name is
// looked up on a thread of its own and waited for until d. A lookup that runs out of time
// is left to end on that thread, which frees its answer. KVT_ERR_IO with the reason
// otherwise ("cannot resolve ...").
kvt_status resolve(Addresses *out, const std::string &host, int port, Deadline d,
                   LookupFn lookup = ::getaddrinfo);

// Lookups whose threads are still running, their callers gone or not (for tests).
size_t lookups_running() noexcept;

}  // namespace kvt::remote
