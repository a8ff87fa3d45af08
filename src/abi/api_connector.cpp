// The connector: a scheduler half and a worker half over one manager (src/connector/).
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>

#include "abi/connector_object.hpp"
#include "abi/guard.hpp"
#include "abi/objects.hpp"
#include "common/versioned.hpp"
#include "connector/connector.hpp"
#include "connector/metadata.hpp"
#include "connector/slot.hpp"

using namespace kvt;
using namespace kvt::abi;
using namespace kvt::conn;


namespace {

// op on c's scheduler half, under its lock.
template <class Op>
kvt_status on_scheduler(const char *fn, kvt_connector *c, Op &&op) noexcept {
  return guard(fn, [&] {
    kvt_status st;
    Connector *conn = connector(fn, c, &st);
    return conn ? conn->with_scheduler(fn, op) : st;
  });
}

// on_scheduler for the six calls of the scheduler half, with the host's hooks around op.
template <class Op>
kvt_status on_call(const char *fn, kvt_connector *c, kvt_obs_trigger trigger,
                   const char *req_id, Op &&op) noexcept {
  return guard(fn, [&] {
    kvt_status st;
    Connector *conn = connector(fn, c, &st);
    return conn ? conn->call(fn, trigger, req_id, op) : st;
  });
}

// op on the worker half, which synchronizes itself (its waits must not block the rest).
template <class Op>
kvt_status on_worker(const char *fn, kvt_connector *c, Op &&op) noexcept {
  return guard(fn, [&] {
    kvt_status st;
    Connector *conn = connector(fn, c, &st);
    return conn ? conn->with_worker(fn, op) : st;
  });
}

// op on the breakpoints of c's scheduler half, without its lock (a pause holds it).
template <class Op>
kvt_status on_breakpoints(const char *fn, kvt_connector *c, Op &&op) noexcept {
  return guard(fn, [&] {
    kvt_status st;
    Connector *conn = connector(fn, c, &st);
    return conn ? conn->with_breakpoints(fn, [&](Breakpoints &bp) { return op(*conn, bp); })
                : st;
  });
}

kvt_status with_id(const char *fn, const char *id) { return check_id(fn, id); }

template <class T>
kvt_status copy_out(const char *fn, T *out, size_t cap, size_t *n, const std::vector<T> &v) {
  if (n == nullptr) return null_arg(fn, "n");
  if (kvt_status s = check_array(fn, "out", out, cap); s != KVT_OK) return s;
  std::copy_n(v.begin(), std::min(cap, v.size()), out);
  *n = v.size();
  return KVT_OK;
}

}  // namespace

extern "C" {

KVT_API void kvt_connector_config_init_sized(kvt_connector_config *cfg, size_t size) {
  if (cfg == nullptr) return;
  if (check_struct_size<kvt_connector_config>("kvt_connector_config_init_sized", "cfg", size) !=
      KVT_OK) {
    if (size >= sizeof cfg->struct_size)
      cfg->struct_size = uint32_t(std::min<size_t>(size, UINT32_MAX));
    return;
  }
  kvt_connector_config full;
  Connector::defaults(&full);
  full.struct_size = uint32_t(size);
  std::memcpy(static_cast<void *>(cfg), &full, size);
}

KVT_API kvt_status kvt_connector_create(kvt_connector **out, kvt_manager *m,
                                        const kvt_connector_config *cfg) {
  static constexpr const char *fn = "kvt_connector_create";
  return on_manager(fn, m, [&](Manager &mgr) {
    if (out == nullptr) return null_arg(fn, "out");
    if (cfg == nullptr) return null_arg(fn, "cfg");
    kvt_connector_config c;
    Connector::defaults(&c);
    if (kvt_status s = read_versioned(&c, *cfg, fn, "cfg"); s != KVT_OK) return s;
    if (kvt_status s = Connector::validate(&c, mgr, fn); s != KVT_OK) return s;
    auto conn = std::make_unique<kvt_connector>();
    conn->manager = m;
    if (kvt_status s = Connector::create(&conn->impl, mgr, c, fn); s != KVT_OK) return s;
    if (c.endpoint_path != nullptr) {
      kvt_status st;
      try {
        st = endpoint_open(&conn->endpoint, mgr, conn->impl.get(), c.endpoint_path);
      } catch (...) {
        st = fail(KVT_ERR_NO_MEMORY, "no memory for the endpoint");
      }
      if (st != KVT_OK)
        return fail(st, "%s: cfg->endpoint_path: %s", fn, std::string(last_error()).c_str());
    }
    *out = conn.release();
    return KVT_OK;
  });
}

KVT_API void kvt_connector_destroy(kvt_connector *c) {
  if (c == nullptr || c->magic != kvt_connector::kMagic) return;
  c->magic = 0;
  endpoint_close(c->endpoint);  // first: its clients inspect the halves
  delete c;
}

namespace {
// Both matched-tokens calls; salt: the request's own, or NULL for the config's.
kvt_status matched_tokens(const char *fn, uint64_t *out_num_tokens, int32_t *out_load_async,
                          kvt_connector *c, const char *req_id, const uint64_t *salt,
                          const uint32_t *tokens, size_t num_tokens,
                          uint64_t num_computed_tokens, uint64_t max_tokens = UINT64_MAX) {
  return on_call(fn, c, KVT_TRIGGER_GET_NUM_NEW_MATCHED_TOKENS, req_id, [&](Scheduler &s) {
    if (out_num_tokens == nullptr) return null_arg(fn, "out_num_tokens");
    if (kvt_status e = with_id(fn, req_id); e != KVT_OK) return e;
    if (kvt_status e = check_array(fn, "tokens", tokens, num_tokens); e != KVT_OK) return e;
    uint64_t n = 0;
    if (kvt_status e = s.get_num_new_matched_tokens(&n, req_id, salt ? *salt : s.salt(), tokens,
                                                    num_tokens, num_computed_tokens,
                                                    max_tokens);
        e != KVT_OK)
      return e;
    *out_num_tokens = n;
    if (out_load_async) *out_load_async = n > 0 && s.load_async();
    return KVT_OK;
  });
}
}  // namespace

KVT_API kvt_status kvt_connector_get_num_new_matched_tokens(
    uint64_t *out_num_tokens, int32_t *out_load_async, kvt_connector *c, const char *req_id,
    const uint32_t *tokens, size_t num_tokens, uint64_t num_computed_tokens) {
  return matched_tokens("kvt_connector_get_num_new_matched_tokens", out_num_tokens,
                        out_load_async, c, req_id, nullptr, tokens, num_tokens,
                        num_computed_tokens);
}

KVT_API kvt_status kvt_connector_get_num_new_matched_tokens_salted(
    uint64_t *out_num_tokens, int32_t *out_load_async, kvt_connector *c, const char *req_id,
    uint64_t salt_hash, const uint32_t *tokens, size_t num_tokens,
    uint64_t num_computed_tokens) {
  return matched_tokens("kvt_connector_get_num_new_matched_tokens_salted", out_num_tokens,
                        out_load_async, c, req_id, &salt_hash, tokens, num_tokens,
                        num_computed_tokens);
}

KVT_API kvt_status kvt_connector_get_num_new_matched_tokens_max(
    uint64_t *out_num_tokens, int32_t *out_load_async, kvt_connector *c, const char *req_id,
    uint64_t salt_hash, const uint32_t *tokens, size_t num_tokens,
    uint64_t num_computed_tokens, uint64_t max_tokens) {
  return matched_tokens("kvt_connector_get_num_new_matched_tokens_max", out_num_tokens,
                        out_load_async, c, req_id, &salt_hash, tokens, num_tokens,
                        num_computed_tokens, max_tokens);
}

KVT_API kvt_status kvt_connector_update_state_after_alloc(
    kvt_connector *c, const char *req_id, const uint32_t *block_ids, size_t num_block_ids,
    uint64_t num_external_tokens) {
  static constexpr const char *fn = "kvt_connector_update_state_after_alloc";
  return on_call(fn, c, KVT_TRIGGER_UPDATE_STATE_AFTER_ALLOC, req_id, [&](Scheduler &s) {
    if (kvt_status e = with_id(fn, req_id); e != KVT_OK) return e;
    if (kvt_status e = check_array(fn, "block_ids", block_ids, num_block_ids); e != KVT_OK)
      return e;
    return s.update_state_after_alloc(req_id, block_ids, num_block_ids, num_external_tokens);
  });
}

KVT_API kvt_status kvt_connector_build_connector_meta(const void **out_meta, size_t *out_len,
                                                      kvt_connector *c,
                                                      const kvt_scheduled_request *reqs,
                                                      size_t num_reqs) {
  static constexpr const char *fn = "kvt_connector_build_connector_meta";
  return on_call(fn, c, KVT_TRIGGER_BUILD_CONNECTOR_META, nullptr, [&](Scheduler &s) {
    if (out_meta == nullptr) return null_arg(fn, "out_meta");
    if (out_len == nullptr) return null_arg(fn, "out_len");
    if (kvt_status e = check_array(fn, "reqs", reqs, num_reqs); e != KVT_OK) return e;
    for (size_t i = 0; i < num_reqs; ++i) {
      if (kvt_status e = check_array(fn, "new_block_ids", reqs[i].new_block_ids,
                                     reqs[i].num_new_block_ids);
          e != KVT_OK)
        return e;
      if (kvt_status e = check_array(fn, "new_token_ids", reqs[i].new_token_ids,
                                     reqs[i].num_new_token_ids);
          e != KVT_OK)
        return e;
    }
    std::string bytes;
    if (kvt_status e = s.build_connector_meta(&bytes, reqs, num_reqs); e != KVT_OK) return e;
    std::string &meta = c->impl->meta();
    meta = std::move(bytes);
    *out_meta = meta.data();
    *out_len = meta.size();
    return KVT_OK;
  });
}

KVT_API kvt_status kvt_connector_update_connector_output(kvt_connector *c, const void *report,
                                                         size_t len) {
  static constexpr const char *fn = "kvt_connector_update_connector_output";
  return on_call(fn, c, KVT_TRIGGER_UPDATE_CONNECTOR_OUTPUT, nullptr, [&](Scheduler &s) {
    if (kvt_status e = check_array(fn, "report", static_cast<const char *>(report), len);
        e != KVT_OK)
      return e;
    Report r;
    if (kvt_status e = decode(&r, report, len); e != KVT_OK)
      return fail(e, "%s: %s", fn, std::string(last_error()).c_str());
    return s.update_connector_output(r);
  });
}

KVT_API kvt_status kvt_connector_request_finished(int32_t *out_delay_free, kvt_connector *c,
                                                  const char *req_id) {
  static constexpr const char *fn = "kvt_connector_request_finished";
  return on_call(fn, c, KVT_TRIGGER_REQUEST_FINISHED, req_id, [&](Scheduler &s) {
    if (out_delay_free == nullptr) return null_arg(fn, "out_delay_free");
    if (kvt_status e = with_id(fn, req_id); e != KVT_OK) return e;
    bool delay = false;
    if (kvt_status e = s.request_finished(&delay, req_id); e != KVT_OK) return e;
    *out_delay_free = delay;
    return KVT_OK;
  });
}

KVT_API kvt_status kvt_connector_request_preempted(kvt_connector *c, const char *req_id) {
  static constexpr const char *fn = "kvt_connector_request_preempted";
  return on_call(fn, c, KVT_TRIGGER_REQUEST_PREEMPTED, req_id, [&](Scheduler &s) {
    if (kvt_status e = with_id(fn, req_id); e != KVT_OK) return e;
    return s.request_preempted(req_id);
  });
}

KVT_API kvt_status kvt_connector_reset_cache(kvt_connector *c) {
  return on_call("kvt_connector_reset_cache", c, KVT_TRIGGER_RESET_CACHE, nullptr,
                 [&](Scheduler &s) { return s.reset_cache(); });
}

KVT_API kvt_status kvt_connector_slot_state(uint32_t *out_state, uint32_t *out_history,
                                            size_t *out_n, size_t cap, kvt_connector *c,
                                            const char *req_id) {
  static constexpr const char *fn = "kvt_connector_slot_state";
  return on_scheduler(fn, c, [&](Scheduler &s) {
    if (kvt_status e = with_id(fn, req_id); e != KVT_OK) return e;
    if (out_history == nullptr && cap > 0) return null_arg(fn, "out_history");
    uint32_t state;
    const std::vector<uint32_t> *history;
    if (kvt_status e = s.slot_state(&state, &history, req_id); e != KVT_OK) return e;
    if (out_state) *out_state = state;
    if (out_history)
      std::copy_n(history->begin(), std::min(cap, history->size()), out_history);
    if (out_n) *out_n = history->size();
    return KVT_OK;
  });
}

KVT_API kvt_status kvt_connector_stats_get(kvt_connector_stats *out, kvt_connector *c) {
  static constexpr const char *fn = "kvt_connector_stats_get";
  return on_scheduler(fn, c, [&](Scheduler &s) {
    if (out == nullptr) return null_arg(fn, "out");
    if (kvt_status e = check_struct_size<kvt_connector_stats>(fn, "out", out->struct_size);
        e != KVT_OK)
      return e;
    kvt_connector_stats full;
    s.stats(&full);
    write_versioned(out, full);
    return KVT_OK;
  });
}

KVT_API size_t kvt_connector_drain_events(kvt_connector *c, kvt_event *out, size_t max) {
  kvt_status st;
  if (connector("kvt_connector_drain_events", c, &st) == nullptr) return 0;
  return kvt_manager_poll(c->manager, out, max);
}

KVT_API kvt_status kvt_connector_register_kv_caches(kvt_connector *c,
                                                    const kvt_g1_layout *layout,
                                                    uint64_t num_blocks) {
  static constexpr const char *fn = "kvt_connector_register_kv_caches";
  return on_worker(fn, c, [&](Worker &w) {
    if (layout == nullptr) return null_arg(fn, "layout");
    kvt_g1_layout l{};
    l.struct_size = sizeof l;
    if (kvt_status e = read_versioned(&l, *layout, fn, "layout"); e != KVT_OK) return e;
    return w.register_kv_caches(l, num_blocks);
  });
}

KVT_API kvt_status kvt_connector_bind_connector_metadata(kvt_connector *c, const void *meta,
                                                         size_t len) {
  static constexpr const char *fn = "kvt_connector_bind_connector_metadata";
  return on_worker(fn, c, [&](Worker &w) {
    if (kvt_status e = check_array(fn, "meta", static_cast<const char *>(meta), len);
        e != KVT_OK)
      return e;
    return w.bind(meta, len);
  });
}

KVT_API kvt_status kvt_connector_clear_connector_metadata(kvt_connector *c) {
  return on_worker("kvt_connector_clear_connector_metadata", c,
                   [&](Worker &w) { return w.clear(); });
}

KVT_API kvt_status kvt_connector_start_load_kv(kvt_connector *c) {
  return on_worker("kvt_connector_start_load_kv", c, [&](Worker &w) { return w.start_load_kv(); });
}

KVT_API kvt_status kvt_connector_wait_for_layer_load(kvt_connector *c, uint32_t layer) {
  return on_worker("kvt_connector_wait_for_layer_load", c,
                   [&](Worker &w) { return w.wait_for_layer_load(layer); });
}

KVT_API kvt_status kvt_connector_save_kv_layer(kvt_connector *c, uint32_t layer) {
  return on_worker("kvt_connector_save_kv_layer", c,
                   [&](Worker &w) { return w.save_kv_layer(layer); });
}

KVT_API kvt_status kvt_connector_wait_for_save(kvt_connector *c) {
  return on_worker("kvt_connector_wait_for_save", c, [&](Worker &w) { return w.wait_for_save(); });
}

KVT_API kvt_status kvt_connector_handle_preemptions(kvt_connector *c, const char *const *req_ids,
                                                    size_t n) {
  static constexpr const char *fn = "kvt_connector_handle_preemptions";
  return on_worker(fn, c, [&](Worker &w) {
    if (kvt_status e = check_array(fn, "req_ids", req_ids, n); e != KVT_OK) return e;
    for (size_t i = 0; i < n; ++i)
      if (kvt_status e = with_id(fn, req_ids[i]); e != KVT_OK) return e;
    return w.handle_preemptions(req_ids, n);
  });
}

KVT_API kvt_status kvt_connector_get_finished(kvt_finished *out, kvt_connector *c) {
  static constexpr const char *fn = "kvt_connector_get_finished";
  return on_worker(fn, c, [&](Worker &w) {
    if (out == nullptr) return null_arg(fn, "out");
    if (kvt_status e = check_struct_size<kvt_finished>(fn, "out", out->struct_size); e != KVT_OK)
      return e;
    kvt_finished full{};
    full.struct_size = sizeof full;
    if (kvt_status e = w.get_finished(&full); e != KVT_OK) return e;
    write_versioned(out, full);
    return KVT_OK;
  });
}

KVT_API const char *kvt_slot_state_str(uint32_t state) { return kvt::slot_state_name(state); }

KVT_API kvt_status kvt_connector_set_hooks(kvt_connector *c, const kvt_connector_hooks *hooks) {
  static constexpr const char *fn = "kvt_connector_set_hooks";
  return on_scheduler(fn, c, [&](Scheduler &s) {
    kvt_connector_hooks h{};
    if (hooks != nullptr) {
      if (kvt_status e = check_struct_size<kvt_connector_hooks>(fn, "hooks", hooks->struct_size);
          e != KVT_OK)
        return e;
      std::memcpy(&h, hooks, hooks->struct_size);
    }
    s.hooks() = h;
    return KVT_OK;
  });
}

KVT_API kvt_status kvt_connector_slots(kvt_slot_info *out, size_t cap, size_t *n,
                                       kvt_connector *c) {
  static constexpr const char *fn = "kvt_connector_slots";
  return on_breakpoints(fn, c, [&](Connector &conn, Breakpoints &) {
    return copy_out(fn, out, cap, n, conn.inspect().slots);
  });
}

KVT_API kvt_status kvt_connector_batches(kvt_batch_info *out, size_t cap, size_t *n,
                                         kvt_connector *c) {
  static constexpr const char *fn = "kvt_connector_batches";
  return on_breakpoints(fn, c, [&](Connector &conn, Breakpoints &) {
    return copy_out(fn, out, cap, n, conn.inspect().batches);
  });
}

KVT_API kvt_status kvt_connector_breakpoint_add(uint64_t *id, kvt_connector *c, uint32_t state,
                                                const char *req_id) {
  static constexpr const char *fn = "kvt_connector_breakpoint_add";
  if (id == nullptr) return null_arg(fn, "id");
  return on_breakpoints(fn, c, [&](Connector &, Breakpoints &bp) {
    if (state > KVT_SLOT_FINISHED)
      return fail(KVT_ERR_INVALID_ARGUMENT, "%s: state %u is not a kvt_slot_state", fn, state);
    if (req_id != nullptr) {
      if (kvt_status e = check_id(fn, req_id); e != KVT_OK) return e;
    } else if (state == 0) {
      return fail(KVT_ERR_INVALID_ARGUMENT,
                  "%s: a breakpoint needs a state, a request id, or both", fn);
    }
    if ((*id = bp.add(state, req_id ? req_id : "")) == 0)
      return fail(KVT_ERR_NO_SPACE, "%s: %d breakpoints are set already, the most there may be",
                  fn, KVT_MAX_BREAKPOINTS);
    return KVT_OK;
  });
}

KVT_API kvt_status kvt_connector_breakpoint_remove(kvt_connector *c, uint64_t id) {
  static constexpr const char *fn = "kvt_connector_breakpoint_remove";
  return on_breakpoints(fn, c, [&](Connector &, Breakpoints &bp) {
    if (!bp.remove(id))
      return fail(KVT_ERR_NOT_FOUND, "%s: no breakpoint %llu", fn, (unsigned long long)id);
    return KVT_OK;
  });
}

KVT_API kvt_status kvt_connector_pause(kvt_connector *c) {
  return on_breakpoints("kvt_connector_pause", c, [&](Connector &, Breakpoints &bp) {
    bp.pause_next();
    return KVT_OK;
  });
}

KVT_API kvt_status kvt_connector_resume(kvt_connector *c) {
  static constexpr const char *fn = "kvt_connector_resume";
  return on_breakpoints(fn, c, [&](Connector &, Breakpoints &bp) {
    if (bp.resume() != KVT_OK) return fail(KVT_ERR_STATE, "%s: nothing is paused", fn);
    return KVT_OK;
  });
}

KVT_API kvt_status kvt_connector_pause_wait(kvt_pause_info *out, kvt_connector *c,
                                            int64_t timeout_ns) {
  static constexpr const char *fn = "kvt_connector_pause_wait";
  if (out == nullptr) return null_arg(fn, "out");
  return on_breakpoints(fn, c, [&](Connector &, Breakpoints &bp) {
    if (kvt_status e = check_struct_size<kvt_pause_info>(fn, "out", out->struct_size);
        e != KVT_OK)
      return e;
    kvt_pause_info full;
    if (!bp.wait_paused(&full, std::chrono::nanoseconds(timeout_ns)))
      return fail(KVT_TIMEOUT, "%s: no thread paused within %lld ns", fn,
                  static_cast<long long>(timeout_ns));
    write_versioned(out, full);
    return KVT_OK;
  });
}

KVT_API kvt_status kvt_connector_set_pause_timeout(kvt_connector *c, uint32_t timeout_ms) {
  static constexpr const char *fn = "kvt_connector_set_pause_timeout";
  return on_breakpoints(fn, c, [&](Connector &, Breakpoints &bp) {
    if (timeout_ms < 1 || timeout_ms > Connector::kMaxPauseMs)
      return fail(KVT_ERR_INVALID_ARGUMENT, "%s: %u ms is not in 1 ms .. 1 hour", fn,
                  timeout_ms);
    bp.set_timeout(std::chrono::milliseconds(timeout_ms));
    return KVT_OK;
  });
}

}  // extern "C"
