// The two calls that find a request's hit and take it: get_num_new_matched_tokens stages
// the hit (the load planner finds and pins it), update_state_after_alloc turns it into a
// load batch once the engine has allocated G1 blocks for it.
#include "connector/scheduler.hpp"

#include <algorithm>

#include "common/error.hpp"
#include "manager/manager.hpp"

namespace kvt::conn {

kvt_status Scheduler::get_num_new_matched_tokens_impl(uint64_t *out, std::string_view id,
                                                      uint64_t salt, const uint32_t *tokens,
                                                      size_t n, uint64_t computed,
                                                      uint64_t max_tokens) {
  static constexpr const char *fn = "kvt_connector_get_num_new_matched_tokens";
  trigger_ = KVT_TRIGGER_GET_NUM_NEW_MATCHED_TOKENS;
  own_tokens_ = false;
  stop_point(id, 0, 0);
  if (computed > n)
    return fail(KVT_ERR_INVALID_ARGUMENT,
                "%s: request '%s': num_computed_tokens %llu exceeds its %zu tokens", fn,
                std::string(id).c_str(), (unsigned long long)computed, n);
  Slot *s = slots_.get(id);
  if (s && (s->state == KVT_SLOT_FINISHING || s->state == KVT_SLOT_FINISHED))
    return transition_error(fn, *s, KVT_SLOT_ONBOARD_STAGED);
  if (s && s->state == KVT_SLOT_ONBOARDING && s->batches > 0)
    return fail(KVT_ERR_STATE, "%s: request '%s' is ONBOARDING with its loads in flight: "
                "they write its G1 blocks until the worker reports them", fn, s->id.c_str());

  TokenSeq seq(salt, page_);
  seq.append(tokens, n);
  // Full blocks only, and never the last token: the engine computes at least one.
  const std::vector<uint64_t> &hashes = seq.seq_hashes();  // read before seq moves
  if (KvSink *kv = m_.kv_sink()) kv->note_tokens(hashes.data(), hashes.size(), tokens);
  size_t usable = n ? std::min<size_t>((n - 1) / page_, hashes.size()) : 0;
  if (max_tokens <= UINT64_MAX - computed)
    usable = std::min<uint64_t>(usable, (computed + max_tokens) / page_);
  // A hit of the engine's that ends inside a block: kvtier loads whole blocks only.
  if (computed % page_) usable = 0;
  size_t first = (computed + page_ - 1) / page_, from = first;
  std::vector<Pinned> hit;
  if (first < usable)
    if (kvt_status st = loads_.hit(&hit, &from, hashes, first, usable); st != KVT_OK) return st;

  if (s == nullptr) {
    s = &slots_.add(std::string(id), std::move(seq));
    ++stats_.transitions[0][KVT_SLOT_INITIALIZED];
    slot_event(*s, 0, KVT_SLOT_INITIALIZED);
    stop_point(s->id, 0, KVT_SLOT_INITIALIZED);
  } else {
    // The engine asks only about waiting requests: one that ran (or loaded) went back to
    // waiting without a request_preempted yet (vLLM's reset_prefix_cache preempts between
    // steps; a failed asynchronous load frees the blocks).
    if (s->state != KVT_SLOT_INITIALIZED && s->state != KVT_SLOT_ONBOARD_STAGED &&
        s->state != KVT_SLOT_PREEMPTED) {
      to_waiting(*s);
      s->preempted_unasked = true;
    }
    loads_.drop_staged(*s);
    // The same count, chained block hashes and partial block: the same tokens. Only asked
    // while a log or the ring keeps the calls' arguments.
    own_tokens_ = m_.bus().keeps_calls() && s->seq.tokens() == seq.tokens() &&
                  s->seq.partial() == seq.partial() && s->seq.seq_hashes() == seq.seq_hashes();
    s->seq = std::move(seq);
  }
  s->matched_from = computed;
  loads_.stage(*s, std::move(hit), from);
  if (!s->staged.empty() && s->state != KVT_SLOT_ONBOARD_STAGED) move(*s, KVT_SLOT_ONBOARD_STAGED);
  if (s->staged.empty() && s->state == KVT_SLOT_ONBOARD_STAGED) move(*s, KVT_SLOT_INITIALIZED);
  *out = s->staged.empty() ? 0 : (from + s->staged.size()) * page_ - computed;
  return KVT_OK;
}

kvt_status Scheduler::update_state_after_alloc_impl(std::string_view id,
                                                    const uint32_t *blocks, size_t n,
                                                    uint64_t external) {
  static constexpr const char *fn = "kvt_connector_update_state_after_alloc";
  trigger_ = KVT_TRIGGER_UPDATE_STATE_AFTER_ALLOC;
  stop_point(id, 0, 0);
  kvt_status st;
  Slot *s = slots_.find(fn, id, &st);
  if (s == nullptr) return st;
  if (s->state != KVT_SLOT_INITIALIZED && s->state != KVT_SLOT_ONBOARD_STAGED &&
      s->state != KVT_SLOT_PREEMPTED)
    return transition_error(fn, *s, KVT_SLOT_ONBOARDING);
  const size_t from = s->staged_from;
  uint64_t hit = s->staged.empty() ? 0 : (from + s->staged.size()) * page_ - s->matched_from;
  if (external != 0 && external != hit)
    return fail(KVT_ERR_INVALID_ARGUMENT,
                "%s: request '%s': num_external_tokens is %llu, but kvtier reported %llu", fn,
                s->id.c_str(), (unsigned long long)external, (unsigned long long)hit);
  if (uint64_t{n} * page_ < s->matched_from + external)
    return fail(KVT_ERR_INVALID_ARGUMENT,
                "%s: request '%s': %zu blocks cannot hold its %llu computed and external tokens",
                fn, s->id.c_str(), n, (unsigned long long)(s->matched_from + external));
  size_t write_from = std::min<size_t>(s->matched_from / page_, n);
  for (size_t i = 0; i < write_from; ++i)
    if (blocks[i] >= writer_.size() && blocks[i] != KVT_BLOCK_ID_NONE)
      return fail(KVT_ERR_INVALID_ARGUMENT,
                  "%s: request '%s': block id %u is out of range (num_gpu_blocks is %zu)", fn,
                  s->id.c_str(), blocks[i], writer_.size());
  if (kvt_status e = check_blocks(fn, *s, blocks + write_from, n - write_from, ++stamp_now_);
      e != KVT_OK)
    return e;
  if (external != 0)
    for (size_t i = from; i < from + s->staged.size(); ++i)
      if (blocks[i] == KVT_BLOCK_ID_NONE)
        return fail(KVT_ERR_INVALID_ARGUMENT,
                    "%s: request '%s': block %zu is KVT_BLOCK_ID_NONE, but kvtier loads it", fn,
                    s->id.c_str(), i);

  unclaim(*s);
  s->blocks.assign(blocks, blocks + n);
  s->write_from = write_from;
  s->released_below = 0;
  s->reach = s->matched_from + external;
  s->store_next = std::max<size_t>(s->store_next, write_from);
  for (size_t i = write_from; i < n; ++i) claim(*s, blocks[i]);
  if (external == 0) {
    loads_.drop_staged(*s);
    if (s->state == KVT_SLOT_ONBOARD_STAGED) move(*s, KVT_SLOT_INITIALIZED);
    return KVT_OK;
  }
  loads_.plan(*s, blocks);
  stats_.matched_tokens += external;
  move(*s, KVT_SLOT_ONBOARDING);
  return KVT_OK;
}

}  // namespace kvt::conn
