// Where every layer sends its observe events (kvtier.h, "Observe"): an interface down here,
// so that block/, pipeline/ and connector/ never include observe/. on() is the one branch a
// call site pays while nobody reads the stream.
#pragma once

#include <atomic>
#include <cstring>
#include <string_view>

#include "kvtier.h"

namespace kvt {

class ObsSink {
 public:
  bool on() const noexcept { return on_.load(std::memory_order_relaxed); }
  // Stamps e with the next sequence number and the time, and hands it to every reader.
  // Never waits for a reader; may be called under a tier's lock.
  virtual void emit(kvt_obs_event &e) noexcept = 0;

 protected:
  ~ObsSink() = default;
  std::atomic<bool> on_{false};
};

// An event of kind k for request id (cut to KVT_REQ_ID_MAX bytes; ids are checked before).
inline kvt_obs_event obs_event(kvt_obs_kind k, std::string_view id = {}) noexcept {
  kvt_obs_event e{};
  e.kind = k;
  size_t n = id.size() < KVT_REQ_ID_MAX ? id.size() : KVT_REQ_ID_MAX;
  std::memcpy(e.req_id, id.data(), n);
  return e;
}

}  // namespace kvt
