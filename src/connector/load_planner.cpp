// The scheduler half's load planner: the hit of a request in G2 and G3 (a prefix, or a
// sliding window's blocks), pinned and staged until the engine allocates for it, and the
// loads that then wait for the next metadata.
#include "connector/scheduler.hpp"

#include <algorithm>
#include <cstring>

#include "block/handle.hpp"
#include "block/tier.hpp"
#include "common/error.hpp"
#include "common/names.hpp"
#include "manager/manager.hpp"

namespace kvt::conn {

namespace {
// The first block a request computed up to `computed` still reads: vLLM frees the blocks
// wholly before computed - sliding_window + 1 (it counts only processed tokens, never more
// than computed, so this frees no block vLLM keeps).
size_t window_start(uint64_t computed, uint32_t window, uint32_t page) {
  return computed + 1 > window ? size_t((computed + 1 - window) / page) : 0;
}
}  // namespace

void Scheduler::drop_staged(Slot &s) {
  if (!s.staged.empty())
    candidate(s, KVT_CANDIDATE_SKIPPED, 0, handle::tier(s.staged[0].block), KVT_TIER_G1,
              s.staged.size());
  std::vector<kvt_block> pins;
  for (const Pinned &p : s.staged) pins.push_back(p.block);
  release(pins);
  s.staged.clear();
}

void Scheduler::drop_planned_loads(Slot &s) {
  auto keep = planned_loads_.begin();
  for (uint64_t id : planned_loads_) {
    auto it = loads_.find(id);
    if (it->second.slot != &s) {
      *keep++ = id;
      continue;
    }
    std::vector<kvt_block> pins;
    for (const Pinned &p : it->second.src) pins.push_back(p.block);
    candidate(s, KVT_CANDIDATE_CANCELLED, id, handle::tier(pins[0]), KVT_TIER_G1, pins.size(),
              KVT_ERR_CANCELLED);
    release(pins);
    if (it->second.async) --s.async_loads;
    loads_.erase(it);
    --s.batches;
  }
  planned_loads_.erase(keep, planned_loads_.end());
}

// Blocks [first, usable): the prefix of them found in G2 or G3, each block where it is (G2
// first): eviction moves a prefix's oldest blocks down to G3 while its newest stay in G2.
kvt_status Scheduler::match_prefix(std::vector<Pinned> *hit, const std::vector<uint64_t> &hashes,
                                   size_t first, size_t usable) {
  std::vector<kvt_block> got(usable - first);
  for (size_t at = first; at < usable;) {
    size_t k = 0;
    for (Tier *t : tiers_) {
      if (t == nullptr || k) continue;
      if (kvt_status st = t->match(&k, got.data(), &hashes[at], usable - at); st != KVT_OK) {
        for (const Pinned &p : *hit) release({p.block});
        hit->clear();
        return st;
      }
    }
    if (k == 0) break;  // in no tier: the prefix ends here
    for (size_t i = 0; i < k; ++i)
      hit->push_back(Pinned{got[i], hashes[at + i], at + i ? hashes[at + i - 1] : 0});
    at += k;
  }
  return KVT_OK;
}

// A sliding window's hit, as vLLM's SlidingWindowManager finds its own: the largest end e
// whose window_blocks_ blocks before it (those from first on; the engine holds the rest)
// are each in G2 or G3. Tokens before the window are never read again, so their blocks
// need not be anywhere.
kvt_status Scheduler::match_window(std::vector<Pinned> *hit, size_t *from,
                                   const std::vector<uint64_t> &hashes, size_t first,
                                   size_t usable) {
  size_t end = 0, run = 0;
  for (size_t j = first; j < usable; ++j) {
    bool present = false;
    for (Tier *t : tiers_) present = present || (t && t->contains(hashes[j]));
    run = present ? run + 1 : 0;
    if (run && run >= std::min(window_blocks_, j + 1 - first)) end = j + 1;
  }
  if (end == 0) return KVT_OK;
  *from = end - std::min(window_blocks_, end - first);
  for (size_t j = *from; j < end; ++j) {
    size_t k = 0;
    kvt_block b = 0;
    for (Tier *t : tiers_) {
      if (t == nullptr || k) continue;
      if (kvt_status st = t->match(&k, &b, &hashes[j], 1); st != KVT_OK) k = 0;
    }
    if (k == 0) {  // gone since the scan (another thread's eviction): no hit this time
      for (const Pinned &p : *hit) release({p.block});
      hit->clear();
      return KVT_OK;
    }
    hit->push_back(Pinned{b, hashes[j], j ? hashes[j - 1] : 0});
  }
  return KVT_OK;
}

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
    if (kvt_status st = window_blocks_ ? match_window(&hit, &from, hashes, first, usable)
                                       : match_prefix(&hit, hashes, first, usable);
        st != KVT_OK)
      return st;

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
    drop_staged(*s);
    // The same count, chained block hashes and partial block: the same tokens. Only asked
    // while a log or the ring keeps the calls' arguments.
    own_tokens_ = m_.bus().keeps_calls() && s->seq.tokens() == seq.tokens() &&
                  s->seq.partial() == seq.partial() && s->seq.seq_hashes() == seq.seq_hashes();
    s->seq = std::move(seq);
  }
  s->matched_from = computed;
  s->staged = std::move(hit);
  s->staged_from = from;
  if (!s->staged.empty())
    candidate(*s, KVT_CANDIDATE_PENDING_EVALUATION, 0, handle::tier(s->staged[0].block),
              KVT_TIER_G1, s->staged.size());
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
  std::vector<CopyOp> lazy;
  for (size_t i = write_from; i < n; ++i) claim(*s, blocks[i], &lazy);
  if (!lazy.empty()) {
    auto &ops = planned_lazy_.back().ops;
    ops.insert(ops.end(), lazy.begin(), lazy.end());
  }
  if (external == 0) {
    drop_staged(*s);
    if (s->state == KVT_SLOT_ONBOARD_STAGED) move(*s, KVT_SLOT_INITIALIZED);
    return KVT_OK;
  }
  LoadRec rec;
  rec.slot = s;
  rec.async = cfg_.load_async != 0;
  s->async_loads += rec.async;
  for (size_t i = 0; i < s->staged.size(); ++i) {
    uint32_t g1 = blocks[from + i];
    rec.g1.push_back(g1);
    if (!content_.empty()) content_[g1] = Content{s->staged[i].hash, s->staged[i].parent, true};
  }
  uint64_t bid = next_batch_++;
  candidate(*s, KVT_CANDIDATE_PROMOTED, bid, handle::tier(s->staged[0].block), KVT_TIER_G1,
            s->staged.size());
  rec.src = std::move(s->staged);
  s->staged.clear();
  loads_.emplace(bid, std::move(rec));
  planned_loads_.push_back(bid);
  ++s->batches;
  stats_.matched_tokens += external;
  move(*s, KVT_SLOT_ONBOARDING);
  return KVT_OK;
}

// vLLM frees a sliding window's blocks as they leave it, unannounced, when it allocates for
// the request (it may then hand them to any request in the same schedule): t no longer
// needs b when b lies before the window of the furthest token t was scheduled to reach.
bool Scheduler::left_window(const Slot &t, uint32_t b) const {
  if (!window_blocks_) return false;
  size_t end = std::min(window_start(t.reach, cfg_.sliding_window, page_), t.blocks.size());
  for (size_t j = t.released_below; j < end; ++j)
    if (t.blocks[j] == b) return true;
  return false;
}

// s's blocks that left the window are the engine's again, and never stored from now on:
// another request may write them in this very step.
void Scheduler::release_window(Slot &s, uint64_t computed) {
  size_t end = std::min(window_start(computed, cfg_.sliding_window, page_), s.blocks.size());
  for (size_t j = s.released_below; j < end; ++j)
    if (s.blocks[j] != KVT_BLOCK_ID_NONE && writer_[s.blocks[j]] == &s)
      writer_[s.blocks[j]] = nullptr;
  s.released_below = std::max(s.released_below, end);
  s.store_next = std::max(s.store_next, end);
}

}  // namespace kvt::conn
