// The scheduler half's calls: each body and its CALL event, the metadata of a step (the loads
// and stores the planners made), the workers' reports, and the requests' ends. The two calls
// that find and take a hit are in scheduler_onboard.cpp; the slot table, the load planner
// and the store planner are in their own files.
#include "connector/scheduler.hpp"

#include <absl/container/flat_hash_set.h>

#include <algorithm>

#include <xxhash.h>

#include "common/error.hpp"
#include "connector/call_args.hpp"
#include "manager/manager.hpp"

namespace kvt::conn {

Shape shape_of(const Manager &m, uint32_t world_size) {
  const kvt_manager_config &c = m.config();
  return Shape{c.page_size, c.g2_blocks, c.g3_blocks, world_size};
}

kvt_status check_shape(const char *fn, const char *what, const Shape &got, const Shape &have) {
  if (got == have) return KVT_OK;
  return fail(KVT_ERR_CORRUPT,
              "%s: the %s comes from a connector with other capacities (page_size %u, G2 %llu, "
              "G3 %llu blocks, %u workers; this one has %u, %llu, %llu, %u)",
              fn, what, got.page_size, (unsigned long long)got.g2_blocks,
              (unsigned long long)got.g3_blocks, got.world_size, have.page_size,
              (unsigned long long)have.g2_blocks, (unsigned long long)have.g3_blocks,
              have.world_size);
}

Scheduler::Scheduler(Manager &m, const kvt_connector_config &c)
    : m_(m), cfg_(c), page_(m.config().page_size),
      window_blocks_(c.sliding_window
                         ? std::max<size_t>(1, (size_t{c.sliding_window} - 1 + page_ - 1) / page_)
                         : 0),
      writer_(c.num_gpu_blocks, nullptr), stamp_(c.num_gpu_blocks, 0),
      stores_(m, c, writer_, stats_, next_batch_),
      loads_(m, c, window_blocks_, stats_, next_batch_, stores_) {
  shape_ = shape_of(m, c.world_size);
  stats_.struct_size = sizeof stats_;
  cfg_.endpoint_path = nullptr;  // borrowed for create only; the ABI serves it
  bp_.set_timeout(std::chrono::milliseconds(c.pause_timeout_ms));
}

Scheduler::~Scheduler() {
  slots_.each([&](Slot &s) { loads_.drop_staged(s); });
}

kvt_status Scheduler::build_connector_meta_impl(std::string *out,
                                                const kvt_scheduled_request *reqs, size_t n) {
  static constexpr const char *fn = "kvt_connector_build_connector_meta";
  trigger_ = KVT_TRIGGER_BUILD_CONNECTOR_META;
  if (bp_.armed()) {
    stop_point({}, 0, 0);
    for (size_t i = 0; i < n; ++i)
      if (check_id(fn, reqs[i].req_id) == KVT_OK) stop_point(reqs[i].req_id, 0, 0);
  }
  // Check everything first: a bad entry changes no slot.
  std::vector<Slot *> slot(n, nullptr);
  std::vector<SlotState> target(n);
  uint32_t stamp = ++stamp_now_;
  // The marks of a refused call come off again: it changes no slot.
  auto refuse = [&](kvt_status e) {
    for (Slot *s : slot)
      if (s) s->new_this_step = false;
    return e;
  };
  for (size_t i = 0; i < n; ++i) {
    const kvt_scheduled_request &r = reqs[i];
    if (kvt_status e = check_id(fn, r.req_id); e != KVT_OK) return refuse(e);
    if ((r.new_block_ids == nullptr && r.num_new_block_ids) ||
        (r.new_token_ids == nullptr && r.num_new_token_ids))
      return refuse(fail(KVT_ERR_INVALID_ARGUMENT, "%s: reqs[%zu] has a NULL array with a count",
                         fn, i));
    kvt_status st;
    Slot *s = slots_.find(fn, r.req_id, &st);
    if (s == nullptr) return refuse(st);
    if (s->new_this_step)
      return refuse(fail(KVT_ERR_INVALID_ARGUMENT, "%s: request '%s' is scheduled twice", fn,
                         s->id.c_str()));
    slot[i] = s;
    s->new_this_step = true;
    // Decoding from the first step that brings sampled tokens on; async scheduling may
    // schedule a decode step before its sampled token is known.
    const bool decoding = s->state == KVT_SLOT_DECODING || s->state == KVT_SLOT_SKIPPED_DECODE ||
                          (r.num_new_token_ids && (s->state == KVT_SLOT_PREFILLING ||
                                                   s->state == KVT_SLOT_SKIPPED_PREFILL));
    target[i] = decoding ? KVT_SLOT_DECODING : KVT_SLOT_PREFILLING;
    kvt_status e = KVT_OK;
    uint64_t blocks = s->blocks.size() + r.num_new_block_ids;
    // Scheduled tokens may reach beyond the known ones (placeholders, drafts), not beyond
    // the blocks that hold them.
    if (!legal(s->state, target[i]))
      e = transition_error(fn, *s, target[i]);
    else if (blocks > UINT64_MAX / page_ ||
             r.num_scheduled_tokens > UINT64_MAX - r.num_computed_tokens ||
             r.num_computed_tokens + r.num_scheduled_tokens > blocks * page_)
      e = fail(KVT_ERR_INVALID_ARGUMENT,
               "%s: request '%s': %llu blocks cannot hold %llu computed + %llu scheduled tokens",
               fn, s->id.c_str(), (unsigned long long)blocks,
               (unsigned long long)r.num_computed_tokens,
               (unsigned long long)r.num_scheduled_tokens);
    if (e != KVT_OK) return refuse(e);
  }
  for (size_t i = 0; i < n; ++i) {
    const kvt_scheduled_request &r = reqs[i];
    Slot *s = slot[i];
    kvt_status e = check_blocks(fn, *s, r.new_block_ids, r.num_new_block_ids, stamp);
    for (size_t k = 0; k < r.num_new_block_ids && e == KVT_OK; ++k) {
      uint32_t b = r.new_block_ids[k];
      if (b != KVT_BLOCK_ID_NONE && writer_[b] == s && !left_window(*s, b))
        e = fail(KVT_ERR_INVALID_ARGUMENT, "%s: request '%s' holds block id %u already", fn,
                 s->id.c_str(), b);
    }
    if (e != KVT_OK) return refuse(e);
  }
  if (window_blocks_)
    for (size_t i = 0; i < n; ++i) release_window(*slot[i], reqs[i].num_computed_tokens);

  Meta meta;
  meta.shape = shape_;
  meta.step = ++step_;
  meta.async_load = cfg_.load_async != 0;
  slots_.each([&](Slot &s) {
    if (s.new_this_step) return;
    if (s.state == KVT_SLOT_PREFILLING) move(s, KVT_SLOT_SKIPPED_PREFILL);
    else if (s.state == KVT_SLOT_DECODING) move(s, KVT_SLOT_SKIPPED_DECODE);
  });
  for (size_t i = 0; i < n; ++i) {
    const kvt_scheduled_request &r = reqs[i];
    Slot &s = *slot[i];
    s.new_this_step = false;
    if (r.num_new_token_ids) append_tokens(s, r.new_token_ids, r.num_new_token_ids);
    for (size_t k = 0; k < r.num_new_block_ids; ++k) {
      s.blocks.push_back(r.new_block_ids[k]);
      claim(s, r.new_block_ids[k]);
    }
    // A step that starts before what the connector counted as computed recomputes (a load
    // failed): its blocks are considered for storing again.
    if (r.num_computed_tokens < s.computed)
      s.store_next = std::max(s.released_below,
                              std::min<size_t>(s.store_next, r.num_computed_tokens / page_));
    // Only known tokens count: a block is stored once its tokens are known and computed.
    s.computed = std::min<uint64_t>(r.num_computed_tokens + r.num_scheduled_tokens,
                                    s.seq.tokens());
    s.reach = std::max(s.reach, r.num_computed_tokens + r.num_scheduled_tokens);
    move(s, target[i]);
    Batch batch;
    stores_.plan(s, step_, &batch);
    if (!batch.ops.empty()) meta.stores.push_back(std::move(batch));
  }
  meta.loads = loads_.take_planned(step_);
  meta.lazy_stores = stores_.take_lazy(step_);
  slots_.each([](Slot &s) { s.preempted_unasked = false; });  // the step's preemptions are in
  meta.finished = std::move(finishing_);
  finishing_.clear();
  *out = encode(meta);
  return KVT_OK;
}

kvt_status Scheduler::update_connector_output_impl(const Report &r) {
  static constexpr const char *fn = "kvt_connector_update_connector_output";
  trigger_ = KVT_TRIGGER_UPDATE_CONNECTOR_OUTPUT;
  stop_point({}, 0, 0);
  if (kvt_status e = check_shape(fn, "report", r.shape, shape_); e != KVT_OK) return e;
  // Check everything first: a report naming an unknown batch changes nothing.
  absl::flat_hash_set<uint64_t> seen;
  auto check = [&](const Done &d, size_t ops, bool sent, const Acks *acks, const char *what) {
    if (acks == nullptr || !sent)
      return fail(KVT_ERR_INVALID_ARGUMENT, "%s: the report names an unknown %s batch %llu",
                  fn, what, (unsigned long long)d.id);
    if (!seen.insert(d.id).second)
      return fail(KVT_ERR_INVALID_ARGUMENT, "%s: the report names %s batch %llu twice", fn,
                  what, (unsigned long long)d.id);
    if (!acks->by.empty() && acks->by[r.rank])
      return fail(KVT_ERR_INVALID_ARGUMENT,
                  "%s: rank %u named %s batch %llu in an earlier report already", fn, r.rank,
                  what, (unsigned long long)d.id);
    for (const Failure &f : d.failed)
      if (f.op >= ops)
        return fail(KVT_ERR_INVALID_ARGUMENT,
                    "%s: the report names copy %u of %s batch %llu, which has %zu", fn, f.op,
                    what, (unsigned long long)d.id, ops);
    return KVT_OK;
  };
  for (const Done &d : r.loads) {
    size_t ops = 0;
    bool sent = false;
    const Acks *acks = loads_.acks(d.id, &ops, &sent);
    if (kvt_status e = check(d, ops, sent, acks, "load"); e != KVT_OK) return e;
  }
  for (const Done &d : r.stores) {
    size_t ops = 0;
    bool sent = false;
    const Acks *acks = stores_.acks(d.id, &ops, &sent);
    if (kvt_status e = check(d, ops, sent, acks, "store"); e != KVT_OK) return e;
  }

  std::vector<Slot *> touched;
  for (const Done &d : r.loads)
    if (Slot *s = loads_.done(r, d, shape_.world_size)) touched.push_back(s);
  for (const Done &d : r.stores)
    if (Slot *s = stores_.done(r, d, shape_.world_size)) touched.push_back(s);
  std::sort(touched.begin(), touched.end());
  touched.erase(std::unique(touched.begin(), touched.end()), touched.end());
  for (Slot *s : touched)
    if (s->state == KVT_SLOT_FINISHING && s->batches == 0) finish(*s);
  return KVT_OK;
}

kvt_status Scheduler::request_finished_impl(bool *delay_free, std::string_view id) {
  static constexpr const char *fn = "kvt_connector_request_finished";
  trigger_ = KVT_TRIGGER_REQUEST_FINISHED;
  stop_point(id, 0, 0);
  kvt_status st;
  Slot *s = slots_.find(fn, id, &st);
  if (s == nullptr) return st;
  if (!legal(s->state, KVT_SLOT_FINISHING)) return transition_error(fn, *s, KVT_SLOT_FINISHING);
  loads_.drop_staged(*s);
  loads_.drop_planned(*s);
  unclaim(*s);
  move(*s, KVT_SLOT_FINISHING);
  // An engine that waits for an asynchronous load's finished_recving frees the request
  // there (vLLM): it must not wait for, nor see, a finished_sending as well.
  *delay_free = s->batches > 0 && s->async_loads == 0;
  if (s->batches == 0) finish(*s);
  else if (*delay_free) finishing_.push_back(s->id);
  return KVT_OK;
}

kvt_status Scheduler::request_preempted_impl(std::string_view id) {
  static constexpr const char *fn = "kvt_connector_request_preempted";
  trigger_ = KVT_TRIGGER_REQUEST_PREEMPTED;
  stop_point(id, 0, 0);
  kvt_status st;
  Slot *s = slots_.find(fn, id, &st);
  if (s == nullptr) return st;
  // Preempted already: by get_num_new_matched_tokens this step (it may be onboarding again),
  // or told twice.
  if (s->preempted_unasked || s->state == KVT_SLOT_PREEMPTED) {
    s->preempted_unasked = false;
    return KVT_OK;
  }
  if (!legal(s->state, KVT_SLOT_PREEMPTED)) return transition_error(fn, *s, KVT_SLOT_PREEMPTED);
  to_waiting(*s);
  return KVT_OK;
}

kvt_status Scheduler::reset_cache() {
  trigger_ = KVT_TRIGGER_RESET_CACHE;
  stop_point({}, 0, 0);
  kvt_status st = reset_cache_impl();
  call_event({}, st, [](ObsEvent &, bool) {});
  return st;
}

kvt_status Scheduler::reset_cache_impl() {
  if (loads_.in_flight())  // they would bring what was stored before into G1 after the reset
    return fail(KVT_ERR_STATE, "kvt_connector_reset_cache: %zu loads are in flight: reset once "
                "they have ended", loads_.count());
  // Stores in flight end unregistered, lazy stores of what G1 held are not made, staged
  // hits are let go, and every registered block leaves: nothing computed before the reset
  // (under other weights, say) is served again.
  stores_.reset();
  slots_.each([&](Slot &s) {
    if (s.state == KVT_SLOT_ONBOARD_STAGED) {
      loads_.drop_staged(s);
      move(s, KVT_SLOT_INITIALIZED);
    }
  });
  for (int t : {KVT_TIER_G2, KVT_TIER_G3})
    if (m_.tier_if_present(t))
      if (kvt_status st = m_.reset(t); st != KVT_OK) return st;
  return KVT_OK;
}

// The six calls: each body, then its CALL event, with the call's arguments when a log or
// the ring keeps them (kvt_event_log_rerun makes the calls again from those). fill(e, args)
// sets the event's counts, and encodes the arguments into e.args when args is true. Short
// of memory the event is lost (a rerun then stops matching): the call has happened.
template <class Fill>
void Scheduler::call_event(std::string_view id, kvt_status st, Fill &&fill) noexcept {
  if (!m_.bus().on()) return;
  try {
    ObsEvent e = obs_event(KVT_OBS_CALL, id);
    e.trigger = trigger_;
    e.status = st;
    fill(e, m_.bus().keeps_calls());
    if (e.args.size() > kMaxCallArgs) e.args.clear();  // too big to log: a rerun names it
    e.bytes = e.args.size();
    m_.bus().emit(e);
  } catch (...) {
  }
}

kvt_status Scheduler::get_num_new_matched_tokens(uint64_t *out, std::string_view id,
                                                 uint64_t salt, const uint32_t *tokens,
                                                 size_t n, uint64_t computed,
                                                 uint64_t max_tokens) {
  kvt_status st =
      get_num_new_matched_tokens_impl(out, id, salt, tokens, n, computed, max_tokens);
  call_event(id, st, [&](ObsEvent &e, bool args) {
    e.tokens = n;
    e.computed = computed;
    e.count = st == KVT_OK ? *out : 0;
    if (args)
      encode_matched(&e.args, tokens, n, computed, st == KVT_OK && own_tokens_,
                     salt == cfg_.salt_hash ? nullptr : &salt, max_tokens);
  });
  return st;
}

kvt_status Scheduler::update_state_after_alloc(std::string_view id, const uint32_t *blocks,
                                               size_t n, uint64_t external) {
  kvt_status st = update_state_after_alloc_impl(id, blocks, n, external);
  call_event(id, st, [&](ObsEvent &e, bool args) {
    e.computed = external;
    e.blocks = n;
    if (args) encode_alloc(&e.args, blocks, n, external);
  });
  return st;
}

kvt_status Scheduler::build_connector_meta(std::string *out, const kvt_scheduled_request *reqs,
                                           size_t n) {
  kvt_status st = build_connector_meta_impl(out, reqs, n);
  // A refused schedule changed nothing, and may hold ids that are not ids: no arguments.
  call_event({}, st, [&](ObsEvent &e, bool args) {
    e.blocks = n;
    if (st != KVT_OK) return;
    e.count = out->size();
    e.hash = XXH64(out->data(), out->size(), 0);
    if (args) encode_schedule(&e.args, reqs, n);
  });
  return st;
}

kvt_status Scheduler::update_connector_output(const Report &r) {
  kvt_status st = update_connector_output_impl(r);
  call_event({}, st, [&](ObsEvent &e, bool args) {
    if (args) e.args = encode(r);
  });
  return st;
}

kvt_status Scheduler::request_finished(bool *delay_free, std::string_view id) {
  kvt_status st = request_finished_impl(delay_free, id);
  call_event(id, st, [&](ObsEvent &e, bool) { e.count = st == KVT_OK && *delay_free; });
  return st;
}

kvt_status Scheduler::request_preempted(std::string_view id) {
  kvt_status st = request_preempted_impl(id);
  call_event(id, st, [](ObsEvent &, bool) {});
  return st;
}

}  // namespace kvt::conn
