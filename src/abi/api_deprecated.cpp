// The names 0.5.0 replaced (kvtier.h, "Deprecated names"): each calls its new name, so that
// programs built against 0.4.0 and earlier keep working.
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

}  // extern "C"
