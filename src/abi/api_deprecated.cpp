// The names 0.5.0 replaced (kvtier.h, "Deprecated names"): each calls its new name, so that
// programs built against 0.4.0 and earlier keep working, and keeps what its old form did
// differently (a count, a code).
#include <algorithm>

#include "abi/guard.hpp"
#include "kvtier.h"

extern "C" {

KVT_API void kvt_set_log_callback(int level, kvt_log_fn fn, void *user_data) {
  kvt_log_set_callback(level, fn, user_data);
}

KVT_API size_t kvt_poll(kvt_manager *m, kvt_event *out, size_t max) {
  return kvt_manager_poll(m, out, max);
}

KVT_API int kvt_event_fd(kvt_manager *m) { return kvt_manager_event_fd(m); }

KVT_API kvt_status kvt_offload(kvt_xfer **out, kvt_manager *m, const kvt_block *src, size_t n,
                               kvt_tier dst, kvt_fence *precondition, uint64_t user_data) {
  return kvt_xfer_offload(out, m, src, n, dst, precondition, user_data);
}

KVT_API kvt_status kvt_onboard(kvt_xfer **out, kvt_manager *m, const kvt_block *src,
                               const kvt_block *dst_g1, size_t n, kvt_fence *precondition,
                               uint64_t user_data) {
  return kvt_xfer_onboard(out, m, src, dst_g1, n, precondition, user_data);
}

KVT_API kvt_status kvt_subscribe(kvt_subscription **out, kvt_manager *m, size_t capacity) {
  return kvt_subscription_create(out, m, capacity);
}

KVT_API kvt_status kvt_recorder_ring(kvt_manager *m, size_t events) {
  return kvt_manager_recorder_ring(m, events);
}

KVT_API kvt_status kvt_recorder_dump(kvt_manager *m, const char *path) {
  return kvt_manager_recorder_dump(m, path);
}

KVT_API kvt_status kvt_recorder_open(kvt_manager *m, const char *path) {
  return kvt_manager_recorder_open(m, path);
}

KVT_API kvt_status kvt_recorder_close(kvt_manager *m) { return kvt_manager_recorder_close(m); }

KVT_API kvt_status kvt_breakpoint_add(uint64_t *id, kvt_connector *c, uint32_t state,
                                      const char *req_id) {
  return kvt_connector_breakpoint_add(id, c, state, req_id);
}

KVT_API kvt_status kvt_breakpoint_remove(kvt_connector *c, uint64_t id) {
  return kvt_connector_breakpoint_remove(c, id);
}

KVT_API kvt_status kvt_match_prefix(size_t *out_n, kvt_block *out_blocks, kvt_manager *m,
                                    kvt_tier tier, const uint64_t *seq_hashes, size_t n) {
  return kvt_tier_match_prefix(out_n, out_blocks, m, tier, seq_hashes, n);
}

KVT_API kvt_status kvt_tier_evictable(size_t *out_n, kvt_block *out, size_t max,
                                      kvt_manager *m, kvt_tier tier) {
  if (out_n == nullptr) return kvt::abi::null_arg("kvt_tier_evictable", "out_n");
  size_t all = 0;
  kvt_status s = kvt_tier_evictable_blocks(out, max, &all, m, tier);
  if (s == KVT_OK) *out_n = std::min(max, all);
  return s;
}

KVT_API kvt_status kvt_hash_sequence(uint64_t *out_seq_hashes, size_t *out_n, size_t cap,
                                     uint64_t salt_hash, const uint32_t *tokens,
                                     size_t n_tokens, uint32_t page_size) {
  static constexpr const char *fn = "kvt_hash_sequence";
  if (out_n == nullptr) return kvt::abi::null_arg(fn, "out_n");
  size_t blocks = 0;
  if (kvt_status s = kvt_hash_tokens(nullptr, 0, &blocks, salt_hash, tokens, n_tokens, page_size);
      s != KVT_OK)
    return s;
  if (out_seq_hashes != nullptr && cap < blocks) {
    *out_n = blocks;
    return kvt::fail(KVT_ERR_INVALID_ARGUMENT, "%s: cap %zu is less than the %zu full blocks",
                     fn, cap, blocks);
  }
  return kvt_hash_tokens(out_seq_hashes, cap, out_n, salt_hash, tokens, n_tokens, page_size);
}

KVT_API kvt_status kvt_seq_hashes(size_t *out_n, uint64_t *out_block_hashes,
                                  uint64_t *out_seq_hashes, const kvt_seq *s, size_t first,
                                  size_t cap) {
  if (out_n == nullptr) return kvt::abi::null_arg("kvt_seq_hashes", "out_n");
  size_t complete = 0;
  kvt_status st = kvt_seq_copy_hashes(out_block_hashes, out_seq_hashes, cap, &complete, s, first);
  if (st == KVT_OK) *out_n = std::min(cap, complete);
  return st;
}

KVT_API kvt_status kvt_event_log_next(kvt_event_log *l, kvt_obs_event *out) {
  kvt_status s = kvt_event_log_read(out, l);
  return s == KVT_ITEROVER ? KVT_ERR_NOT_FOUND : s;
}

KVT_API size_t kvt_connector_take_events(kvt_event *out, size_t max, kvt_connector *c) {
  return kvt_connector_drain_events(c, out, max);
}

KVT_API kvt_status kvt_connector_wait_paused(kvt_pause_info *out, kvt_connector *c,
                                             uint32_t timeout_ms) {
  kvt_status s = kvt_connector_pause_wait(out, c, int64_t(timeout_ms) * 1000000);
  return s == KVT_TIMEOUT ? KVT_AGAIN : s;
}

}  // extern "C"
