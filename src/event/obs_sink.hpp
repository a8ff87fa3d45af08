// Where every layer sends its observe events (kvtier.h, "Observe"): an interface down here,
// so that block/, pipeline/ and connector/ never include observe/. on() is the one branch a
// call site pays while nobody reads the stream.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "kvtier.h"

namespace kvt {

// False only in the baseline build of bench/observe_cost.sh (cmake -DKVT_NO_OBSERVE=ON): every
// observe call site (the stream, breakpoints, hooks) is then compiled out.
#ifdef KVT_NO_OBSERVE
inline constexpr bool kObserve = false;
#else
inline constexpr bool kObserve = true;
#endif

// The most bytes of a CALL event's arguments that a log keeps; a call with more is logged
// without them.
inline constexpr size_t kMaxCallArgs = 16 << 20;

// kvt_obs_event as the library carries it: the request id as a string rather than a
// 256-byte array, so that an event costs its fields, not the id's room.
struct ObsEvent {
  uint64_t seq = 0, time_ns = 0;
  uint32_t kind = 0, state = 0, prev = 0, trigger = 0, src = 0, dst = 0;
  kvt_status status = KVT_OK;
  uint64_t batch = 0, hash = 0, parent_hash = 0, tokens = 0, computed = 0, blocks = 0,
           bytes = 0, duration_ns = 0, count = 0;
  std::string req_id;  // at most KVT_REQ_ID_MAX bytes, no NUL
  std::string args;    // CALL: the call's arguments (connector/call_args.hpp), for the log
};

class ObsSink {
 public:
  bool on() const noexcept { return kObserve && on_.load(std::memory_order_relaxed); }
  // Whether a log or the ring keeps events, so that CALL events need their arguments.
  bool keeps_calls() const noexcept { return keeps_calls_.load(std::memory_order_relaxed); }
  // Stamps e with the next sequence number and the time, and hands it to every reader.
  // Never waits for a reader; may be called under a tier's lock.
  virtual void emit(ObsEvent &e) noexcept = 0;
  // A tier's BLOCK_* and TIER_CLEARED events (kvt_manager_poll's), in order, under one stamp.
  virtual void emit_tier_events(const kvt_event *ev, size_t n) noexcept = 0;

 protected:
  ~ObsSink() = default;
  std::atomic<bool> on_{false};
  std::atomic<bool> keeps_calls_{false};
};

// An event of kind k for request id (ids are checked to be 1..KVT_REQ_ID_MAX bytes before).
inline ObsEvent obs_event(kvt_obs_kind k, std::string_view id = {}) {
  ObsEvent e;
  e.kind = k;
  e.req_id.assign(id.substr(0, KVT_REQ_ID_MAX));
  return e;
}

void to_c(const ObsEvent &e, kvt_obs_event *out) noexcept;  // zeroes what e does not set

// kvt_obs_kind_str, kvt_candidate_state_str, kvt_obs_trigger_str.
const char *obs_kind_name(uint32_t kind) noexcept;
const char *candidate_name(uint32_t state) noexcept;
const char *trigger_name(uint32_t trigger) noexcept;
ObsEvent from_c(const kvt_obs_event &e);

}  // namespace kvt
