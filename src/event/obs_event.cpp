#include "event/obs_sink.hpp"

#include <algorithm>
#include <cstring>

namespace kvt {

void to_c(const ObsEvent &e, kvt_obs_event *out) noexcept {
  *out = kvt_obs_event{};
  out->seq = e.seq;
  out->time_ns = e.time_ns;
  out->kind = e.kind;
  out->state = e.state;
  out->prev = e.prev;
  out->trigger = e.trigger;
  out->src = e.src;
  out->dst = e.dst;
  out->status = e.status;
  out->batch = e.batch;
  out->hash = e.hash;
  out->parent_hash = e.parent_hash;
  out->tokens = e.tokens;
  out->computed = e.computed;
  out->blocks = e.blocks;
  out->bytes = e.bytes;
  out->duration_ns = e.duration_ns;
  out->count = e.count;
  std::memcpy(out->req_id, e.req_id.data(), std::min<size_t>(e.req_id.size(), KVT_REQ_ID_MAX));
}

ObsEvent from_c(const kvt_obs_event &e) {
  ObsEvent o;
  o.seq = e.seq;
  o.time_ns = e.time_ns;
  o.kind = e.kind;
  o.state = e.state;
  o.prev = e.prev;
  o.trigger = e.trigger;
  o.src = e.src;
  o.dst = e.dst;
  o.status = e.status;
  o.batch = e.batch;
  o.hash = e.hash;
  o.parent_hash = e.parent_hash;
  o.tokens = e.tokens;
  o.computed = e.computed;
  o.blocks = e.blocks;
  o.bytes = e.bytes;
  o.duration_ns = e.duration_ns;
  o.count = e.count;
  o.req_id.assign(e.req_id, strnlen(e.req_id, KVT_REQ_ID_MAX));
  return o;
}

const char *obs_kind_name(uint32_t kind) noexcept {
  static constexpr const char *names[] = {"UNKNOWN",       "SLOT",          "CANDIDATE",
                                          "BLOCK_STORED",  "BLOCK_REMOVED", "TIER_CLEARED",
                                          "TRANSFER",      "DROPPED",       "CALL"};
  return kind < std::size(names) ? names[kind] : names[0];
}

const char *candidate_name(uint32_t state) noexcept {
  static constexpr const char *names[] = {"UNKNOWN",   "PENDING_EVALUATION", "PROMOTED",
                                          "SKIPPED",   "COMPLETED",          "FAILED",
                                          "CANCELLED"};
  return state < std::size(names) ? names[state] : names[0];
}

const char *trigger_name(uint32_t trigger) noexcept {
  static constexpr const char *names[] = {"UNKNOWN",
                                          "GET_NUM_NEW_MATCHED_TOKENS",
                                          "UPDATE_STATE_AFTER_ALLOC",
                                          "BUILD_CONNECTOR_META",
                                          "UPDATE_CONNECTOR_OUTPUT",
                                          "REQUEST_FINISHED",
                                          "REQUEST_PREEMPTED",
                                          "RESET_CACHE"};
  return trigger < std::size(names) ? names[trigger] : names[0];
}

}  // namespace kvt
