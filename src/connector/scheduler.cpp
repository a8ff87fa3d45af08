#include "connector/scheduler.hpp"

#include <algorithm>
#include <cstring>

#include <xxhash.h>

#include "block/handle.hpp"
#include "block/tier.hpp"
#include "common/error.hpp"
#include "common/names.hpp"
#include "connector/call_args.hpp"
#include "manager/manager.hpp"

namespace kvt::conn {

namespace {
std::string quoted(std::string_view id) { return std::string(id); }
// The first block a request computed up to `computed` still reads: vLLM frees the blocks
// wholly before computed - sliding_window + 1 (it counts only processed tokens, never more
// than computed, so this frees no block vLLM keeps).
size_t window_start(uint64_t computed, uint32_t window, uint32_t page) {
  return computed + 1 > window ? size_t((computed + 1 - window) / page) : 0;
}
// Debian's abseil has its own string_view.
absl::string_view key(std::string_view id) { return {id.data(), id.size()}; }
}  // namespace

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
    : m_(m), cfg_(c), store_tier_(m.tier_if_present(int(c.store_tier))),
      tiers_{m.tier_if_present(KVT_TIER_G2), m.tier_if_present(KVT_TIER_G3)},
      page_(m.config().page_size), writer_(c.num_gpu_blocks, nullptr),
      stamp_(c.num_gpu_blocks, 0) {
  shape_ = shape_of(m, c.world_size);
  if (c.sliding_window)
    window_blocks_ = std::max<size_t>(1, (size_t{c.sliding_window} - 1 + page_ - 1) / page_);
  if (c.offload == KVT_OFFLOAD_LAZY) content_.resize(c.num_gpu_blocks);
  stats_.struct_size = sizeof stats_;
  cfg_.endpoint_path = nullptr;  // borrowed for create only; the ABI serves it
  bp_.set_timeout(std::chrono::milliseconds(c.pause_timeout_ms));
}

Scheduler::~Scheduler() {
  for (auto &[id, s] : slots_) drop_staged(*s);
  for (auto &[id, r] : loads_)
    for (const Pinned &p : r.src) release({p.block});
  for (auto &[id, r] : stores_) release(r.dst);
}

void Scheduler::release(const std::vector<kvt_block> &blocks) {
  // The scheduler's own references: failing would be a bug, and there is no caller to tell.
  if (!blocks.empty()) m_.release(blocks.data(), blocks.size());
}

Slot *Scheduler::find(const char *fn, std::string_view id, kvt_status *st) const {
  auto it = slots_.find(key(id));
  if (it == slots_.end()) {
    *st = fail(KVT_ERR_NOT_FOUND, "%s: unknown request id '%s' (never seen, or finished)", fn,
               quoted(id).c_str());
    return nullptr;
  }
  *st = KVT_OK;
  return it->second.get();
}

kvt_status Scheduler::transition_error(const char *fn, const Slot &s, SlotState to) const {
  return fail(KVT_ERR_STATE, "%s: request '%s' is %s, which cannot become %s", fn,
              s.id.c_str(), slot_state_name(s.state), slot_state_name(to));
}

void Scheduler::move(Slot &s, SlotState to) {
  ++stats_.transitions[s.state][to];
  const uint32_t prev = s.state;
  slot_event(s, prev, to);
  if (s.state != to) s.to(to);
  stop_point(s.id, prev, to);
}

void Scheduler::slot_event(const Slot &s, uint32_t prev, uint32_t to) {
  if (kObserve && hooks_.transition)
    hooks_.transition(hooks_.user, s.id.c_str(), prev, to, trigger_);
  if (!m_.bus().on()) return;
  ObsEvent e = obs_event(KVT_OBS_SLOT, s.id);
  e.prev = prev;
  e.state = to;
  e.trigger = trigger_;
  e.tokens = s.seq.tokens();
  e.computed = s.computed;
  m_.bus().emit(e);
}

void Scheduler::candidate(const Slot &s, kvt_candidate_state state, uint64_t batch, int src,
                          int dst, uint64_t blocks, kvt_status st) {
  if (!m_.bus().on()) return;
  ObsEvent e = obs_event(KVT_OBS_CANDIDATE, s.id);
  e.state = state;
  e.batch = batch;
  e.src = uint32_t(src);
  e.dst = uint32_t(dst);
  e.blocks = blocks;
  e.status = st;
  m_.bus().emit(e);
}

// Block ids the call hands to s for writing: in range, not written by another live request,
// not given twice. Marks them with stamp for the duplicate check.
kvt_status Scheduler::check_blocks(const char *fn, const Slot &s, const uint32_t *ids, size_t n,
                                   uint32_t stamp) {
  for (size_t i = 0; i < n; ++i) {
    uint32_t b = ids[i];
    if (b == KVT_BLOCK_ID_NONE) continue;
    if (b >= writer_.size())
      return fail(KVT_ERR_INVALID_ARGUMENT,
                  "%s: request '%s': block id %u is out of range (num_gpu_blocks is %zu)", fn,
                  s.id.c_str(), b, writer_.size());
    if (writer_[b] != nullptr && writer_[b] != &s && !left_window(*writer_[b], b))
      return fail(KVT_ERR_INVALID_ARGUMENT,
                  "%s: request '%s': block id %u is written by request '%s'", fn, s.id.c_str(),
                  b, writer_[b]->id.c_str());
    if (stamp_[b] == stamp)
      return fail(KVT_ERR_INVALID_ARGUMENT, "%s: request '%s': block id %u is given twice", fn,
                  s.id.c_str(), b);
    stamp_[b] = stamp;
  }
  return KVT_OK;
}

// s now writes g1. In lazy mode, whatever full block g1 held is stored first, unless its
// store tier has it already.
void Scheduler::claim(Slot &s, uint32_t g1, std::vector<CopyOp> *lazy) {
  if (g1 == KVT_BLOCK_ID_NONE) return;
  writer_[g1] = &s;
  if (content_.empty() || !content_[g1].valid) return;
  Content c = content_[g1];
  content_[g1].valid = false;
  StoreRec *rec = nullptr;
  if (!planned_lazy_.empty() && planned_lazy_.back().req_id == s.id)
    rec = &stores_.at(planned_lazy_.back().id);
  StoreRec fresh = store_rec(s);
  if (plan_store(g1, c.hash, c.parent, lazy, rec ? rec : &fresh) && rec == nullptr) {
    uint64_t id = next_batch_++;
    planned_lazy_.push_back(Batch{id, s.id, {}});
    stores_.emplace(id, std::move(fresh));
    ++s.batches;
  }
}

void Scheduler::append_tokens(Slot &s, const uint32_t *tokens, size_t n) {
  KvSink *kv = m_.kv_sink();
  if (kv == nullptr) return s.seq.append(tokens, n);
  // The filled blocks' tokens: the partial block's, then the new ones.
  std::vector<uint32_t> filled = s.seq.partial();
  filled.insert(filled.end(), tokens, tokens + n);
  const size_t before = s.seq.blocks();
  s.seq.append(tokens, n);
  kv->note_tokens(s.seq.seq_hashes().data() + before, s.seq.blocks() - before, filled.data());
}

// Blocks s wrote are the engine's again.
void Scheduler::unclaim(Slot &s) {
  for (uint32_t b : s.blocks)
    if (b != KVT_BLOCK_ID_NONE && writer_[b] == &s) writer_[b] = nullptr;
}

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

// Plans one store of g1's block (hash, parent) into rec and ops: false when the store tier
// has it, a store of it is in flight, or no slot can be had.
bool Scheduler::plan_store(uint32_t g1, uint64_t hash, uint64_t parent,
                           std::vector<CopyOp> *ops, StoreRec *rec) {
  if (storing_.contains(hash) || store_tier_->contains(hash)) return false;
  kvt_block dst;
  if (store_tier_->alloc(&dst, 1) != KVT_OK) {
    ++stats_.store_failures;  // every block of the tier is pinned
    return false;
  }
  storing_.insert(hash);
  ops->push_back(CopyOp{g1, uint8_t(store_tier_->id()), handle::slot(dst), hash, parent});
  rec->dst.push_back(dst);
  rec->hash.push_back(hash);
  rec->parent.push_back(parent);
  return true;
}

// Stores of s's blocks want_ (none in flight): those the store tier lacks, each to a new
// block of it. One presence check and one allocation for all of them, so the tier's lock
// is taken twice per step, not twice per block.
void Scheduler::plan_stores(Slot &s, Batch *batch, StoreRec *rec) {
  const auto &hashes = s.seq.seq_hashes();
  want_hash_.resize(want_.size());
  present_.resize(want_.size());
  for (size_t i = 0; i < want_.size(); ++i) want_hash_[i] = hashes[want_[i]];
  store_tier_->contains_each(want_hash_.data(), want_.size(), present_.data());
  size_t k = 0;
  for (size_t i = 0; i < want_.size(); ++i)
    if (!present_[i]) want_[k++] = want_[i];
  want_.resize(k);
  dst_.resize(k);
  size_t got = k;
  if (k && store_tier_->alloc(dst_.data(), k) != KVT_OK) {
    // All or nothing refused: as many as the tier can give (the rest is pinned).
    for (got = 0; got < k && store_tier_->alloc(&dst_[got], 1) == KVT_OK;) ++got;
    stats_.store_failures += k - got;
  }
  std::vector<kvt_block> unused;
  for (size_t i = 0; i < got; ++i) {
    const size_t j = want_[i];
    if (!storing_.insert(hashes[j]).second) {  // the same hash twice in one sequence
      unused.push_back(dst_[i]);
      continue;
    }
    const uint64_t parent = j ? hashes[j - 1] : 0;
    batch->ops.push_back(CopyOp{s.blocks[j], uint8_t(store_tier_->id()),
                                handle::slot(dst_[i]), hashes[j], parent});
    rec->dst.push_back(dst_[i]);
    rec->hash.push_back(hashes[j]);
    rec->parent.push_back(parent);
  }
  if (!unused.empty()) release(unused);
}

// Eager: stores for the full blocks s has computed since the last plan. Lazy: remembers
// what their G1 blocks hold.
void Scheduler::plan_eager(Slot &s, Batch *batch) {
  const auto &hashes = s.seq.seq_hashes();
  size_t full = std::min<size_t>({s.computed / page_, hashes.size(), s.blocks.size()});
  StoreRec rec = store_rec(s);
  const int dst = store_tier_->id();
  want_.clear();
  for (size_t j = s.store_next; j < full; ++j) {
    // The engine's null block, or one a sliding window left that another request took.
    if (s.blocks[j] == KVT_BLOCK_ID_NONE || writer_[s.blocks[j]] != &s) continue;
    if (!content_.empty())
      content_[s.blocks[j]] = Content{hashes[j], j ? hashes[j - 1] : 0, true};
    else if (!storing_.contains(hashes[j]))
      want_.push_back(j);
  }
  if (!want_.empty()) plan_stores(s, batch, &rec);
  const size_t considered = full > s.store_next ? full - s.store_next : 0;
  s.store_next = std::max(s.store_next, full);
  if (considered && !content_.empty())  // lazy: stored only when the engine reuses them
    candidate(s, KVT_CANDIDATE_PENDING_EVALUATION, 0, KVT_TIER_G1, dst, considered);
  else if (considered > batch->ops.size())
    candidate(s, KVT_CANDIDATE_SKIPPED, 0, KVT_TIER_G1, dst, considered - batch->ops.size());
  if (batch->ops.empty()) return;
  batch->id = next_batch_++;
  batch->req_id = s.id;
  rec.step = step_;
  rec.eager = true;
  stores_.emplace(batch->id, std::move(rec));
  ++s.batches;
  candidate(s, KVT_CANDIDATE_PROMOTED, batch->id, KVT_TIER_G1, dst, batch->ops.size());
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
                quoted(id).c_str(), (unsigned long long)computed, n);
  auto it = slots_.find(key(id));
  Slot *s = it == slots_.end() ? nullptr : it->second.get();
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
    auto fresh = std::make_unique<Slot>(std::string(id), std::move(seq));
    s = fresh.get();
    ++stats_.transitions[0][KVT_SLOT_INITIALIZED];
    slots_.emplace(s->id, std::move(fresh));
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
  Slot *s = find(fn, id, &st);
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
    Slot *s = find(fn, r.req_id, &st);
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
  for (auto &[id, s] : slots_) {
    if (s->new_this_step) continue;
    if (s->state == KVT_SLOT_PREFILLING) move(*s, KVT_SLOT_SKIPPED_PREFILL);
    else if (s->state == KVT_SLOT_DECODING) move(*s, KVT_SLOT_SKIPPED_DECODE);
  }
  for (size_t i = 0; i < n; ++i) {
    const kvt_scheduled_request &r = reqs[i];
    Slot &s = *slot[i];
    s.new_this_step = false;
    if (r.num_new_token_ids) append_tokens(s, r.new_token_ids, r.num_new_token_ids);
    std::vector<CopyOp> lazy;
    for (size_t k = 0; k < r.num_new_block_ids; ++k) {
      s.blocks.push_back(r.new_block_ids[k]);
      claim(s, r.new_block_ids[k], &lazy);
    }
    if (!lazy.empty()) {
      auto &ops = planned_lazy_.back().ops;
      ops.insert(ops.end(), lazy.begin(), lazy.end());
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
    plan_eager(s, &batch);
    if (!batch.ops.empty()) meta.stores.push_back(std::move(batch));
  }
  for (uint64_t id : planned_loads_) {
    LoadRec &rec = loads_.at(id);
    rec.step = step_;
    Batch b{id, rec.slot->id, {}};
    for (size_t i = 0; i < rec.src.size(); ++i) {
      const Pinned &p = rec.src[i];
      b.ops.push_back(CopyOp{rec.g1[i], uint8_t(handle::tier(p.block)), handle::slot(p.block),
                             p.hash, p.parent});
    }
    meta.loads.push_back(std::move(b));
  }
  planned_loads_.clear();
  for (Batch &b : planned_lazy_) {
    StoreRec &rec = stores_.at(b.id);
    rec.step = step_;
    candidate(*rec.slot, KVT_CANDIDATE_PROMOTED, b.id, KVT_TIER_G1, rec.tier->id(),
              b.ops.size());
  }
  meta.lazy_stores = std::move(planned_lazy_);
  planned_lazy_.clear();
  for (auto &[id, s] : slots_) s->preempted_unasked = false;  // the step's preemptions are in
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
    auto it = loads_.find(d.id);
    const bool known = it != loads_.end();
    if (kvt_status e = check(d, known ? it->second.src.size() : 0, known && it->second.step != 0,
                             known ? &it->second.acks : nullptr, "load");
        e != KVT_OK)
      return e;
  }
  for (const Done &d : r.stores) {
    auto it = stores_.find(d.id);
    const bool known = it != stores_.end();
    if (kvt_status e = check(d, known ? it->second.dst.size() : 0, known && it->second.step != 0,
                             known ? &it->second.acks : nullptr, "store");
        e != KVT_OK)
      return e;
  }

  std::vector<Slot *> touched;
  std::vector<uint32_t> fresh;
  for (const Done &d : r.loads) {
    auto it = loads_.find(d.id);
    LoadRec &rec = it->second;
    const bool failed_before = rec.acks.any_failed;
    const bool last = ack(rec.acks, r, d, rec.src.size(), &fresh);
    for (uint32_t op : fresh) {
      // A copy that failed (its checksum, an I/O error, on any rank) leaves the registry at
      // once: no match serves it, and the engine's recompute is not matched to it again and
      // again. Its pin holds the block until the last rank's report.
      m_.tier_of(rec.src[op].block)->remove(rec.src[op].block);
      if (!content_.empty()) content_[rec.g1[op]].valid = false;
    }
    if (rec.acks.any_failed && !failed_before) doom_stores(*rec.slot, rec.step);
    if (!last) continue;
    std::vector<kvt_block> pins;
    kvt_status first = KVT_OK;
    for (size_t i = 0; i < rec.src.size(); ++i) {
      pins.push_back(rec.src[i].block);
      const kvt_status st = rec.acks.failed[i];
      ++(st != KVT_OK ? stats_.load_errors : stats_.loaded_blocks);
      if (first == KVT_OK) first = st;
    }
    candidate(*rec.slot, first == KVT_OK ? KVT_CANDIDATE_COMPLETED : KVT_CANDIDATE_FAILED, d.id,
              handle::tier(pins[0]), KVT_TIER_G1, pins.size(), first);
    release(pins);
    if (rec.async) --rec.slot->async_loads;
    --rec.slot->batches;
    touched.push_back(rec.slot);
    loads_.erase(it);
  }
  for (const Done &d : r.stores) {
    auto it = stores_.find(d.id);
    StoreRec &rec = it->second;
    if (!ack(rec.acks, r, d, rec.dst.size(), &fresh)) continue;
    std::vector<kvt_block> done;
    kvt_status first = KVT_OK;
    for (size_t i = 0; i < rec.dst.size(); ++i) {
      if (!rec.doomed) storing_.erase(rec.hash[i]);
      const kvt_status st = rec.acks.failed[i];
      if (first == KVT_OK) first = st;
      kvt_block b = rec.dst[i];
      if (st == KVT_OK && !rec.doomed &&
          rec.tier->register_hash(&b, rec.dst[i], rec.hash[i], rec.parent[i]) == KVT_OK) {
        ++stats_.stored_blocks;
      } else {
        ++stats_.store_failures;
        b = rec.dst[i];
      }
      done.push_back(b);
    }
    if (m_.bus().on()) {
      const kvt_candidate_state cs = rec.doomed      ? KVT_CANDIDATE_CANCELLED
                                     : first == KVT_OK ? KVT_CANDIDATE_COMPLETED
                                                       : KVT_CANDIDATE_FAILED;
      candidate(*rec.slot, cs, d.id, KVT_TIER_G1, rec.tier->id(), rec.dst.size(),
                rec.doomed ? KVT_ERR_CANCELLED : first);
    }
    release(done);
    --rec.slot->batches;
    touched.push_back(rec.slot);
    stores_.erase(it);
  }
  std::sort(touched.begin(), touched.end());
  touched.erase(std::unique(touched.begin(), touched.end()), touched.end());
  for (Slot *s : touched)
    if (s->state == KVT_SLOT_FINISHING && s->batches == 0) finish(*s);
  return KVT_OK;
}

bool Scheduler::ack(Acks &a, const Report &r, const Done &d, size_t ops,
                    std::vector<uint32_t> *fresh) {
  if (a.by.empty()) {
    a.by.resize(shape_.world_size);
    a.failed.assign(ops, KVT_OK);
  }
  a.by[r.rank] = true;
  ++a.count;
  fresh->clear();
  for (const Failure &f : d.failed) {
    if (a.failed[f.op] != KVT_OK) continue;
    a.failed[f.op] = f.status;
    a.any_failed = true;
    fresh->push_back(f.op);
  }
  return a.count == shape_.world_size;
}

// s's eager stores of the step in which a load of s failed, and of later steps (async
// scheduling plans the next step before this report), are never registered: what they copy
// was computed over bytes that never arrived. Their hashes are free to be planned again as
// soon as the blocks are recomputed, which may be before the cancellations' report.
void Scheduler::doom_stores(const Slot &s, uint64_t step) {
  for (auto &[id, rec] : stores_) {
    if (rec.slot != &s || rec.step < step || !rec.eager || rec.doomed) continue;
    rec.doomed = true;
    for (uint64_t h : rec.hash) storing_.erase(h);
  }
}

// FINISHING -> FINISHED: the slot goes; its history stays for a while.
void Scheduler::finish(Slot &s) {
  move(s, KVT_SLOT_FINISHED);
  if (done_.size() >= kKeepFinished) {
    done_.erase(done_order_.front());
    done_order_.pop_front();
  }
  done_order_.push_back(s.id);
  done_[s.id] = std::move(s.history);
  slots_.erase(s.id);
}

kvt_status Scheduler::request_finished_impl(bool *delay_free, std::string_view id) {
  static constexpr const char *fn = "kvt_connector_request_finished";
  trigger_ = KVT_TRIGGER_REQUEST_FINISHED;
  stop_point(id, 0, 0);
  kvt_status st;
  Slot *s = find(fn, id, &st);
  if (s == nullptr) return st;
  if (!legal(s->state, KVT_SLOT_FINISHING)) return transition_error(fn, *s, KVT_SLOT_FINISHING);
  drop_staged(*s);
  drop_planned_loads(*s);
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
  Slot *s = find(fn, id, &st);
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

void Scheduler::to_waiting(Slot &s) {
  drop_staged(s);
  drop_planned_loads(s);
  unclaim(s);
  s.blocks.clear();
  s.computed = 0;
  s.write_from = 0;
  s.store_next = 0;  // its blocks may be stored again: plan_store skips what is present
  s.released_below = 0;
  s.reach = 0;
  ++stats_.preemptions;
  move(s, KVT_SLOT_PREEMPTED);
}

kvt_status Scheduler::reset_cache() {
  trigger_ = KVT_TRIGGER_RESET_CACHE;
  stop_point({}, 0, 0);
  kvt_status st = reset_cache_impl();
  call_event({}, st, [](ObsEvent &, bool) {});
  return st;
}

kvt_status Scheduler::reset_cache_impl() {
  if (!loads_.empty())  // they would bring what was stored before into G1 after the reset
    return fail(KVT_ERR_STATE, "kvt_connector_reset_cache: %zu loads are in flight: reset once "
                "they have ended", loads_.size());
  // Stores in flight end unregistered, lazy stores of what G1 held are not made, staged
  // hits are let go, and every registered block leaves: nothing computed before the reset
  // (under other weights, say) is served again.
  for (auto &[id, rec] : stores_) rec.doomed = true;
  storing_.clear();
  for (Content &c : content_) c.valid = false;
  for (auto &[id, s] : slots_)
    if (s->state == KVT_SLOT_ONBOARD_STAGED) {
      drop_staged(*s);
      move(*s, KVT_SLOT_INITIALIZED);
    }
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

kvt_status Scheduler::slot_state(uint32_t *state, const std::vector<uint32_t> **history,
                                 std::string_view id) const {
  if (auto it = slots_.find(key(id)); it != slots_.end()) {
    *state = it->second->state;
    *history = &it->second->history;
    return KVT_OK;
  }
  if (auto it = done_.find(key(id)); it != done_.end()) {
    *state = KVT_SLOT_FINISHED;
    *history = &it->second;
    return KVT_OK;
  }
  kvt_status st;
  find("kvt_connector_slot_state", id, &st);
  return st;
}

void Scheduler::stats(kvt_connector_stats *out) const { *out = stats_; }

Snapshot Scheduler::snapshot() const {
  Snapshot out;
  const auto now = std::chrono::steady_clock::now();
  auto set_id = [](char *dst, const std::string &id) {
    std::memcpy(dst, id.data(), std::min<size_t>(id.size(), KVT_REQ_ID_MAX));
  };
  for (const auto &[id, s] : slots_) {
    kvt_slot_info i{};
    set_id(i.req_id, s->id);
    i.state = s->state;
    i.age_ns = uint64_t(
        std::chrono::duration_cast<std::chrono::nanoseconds>(now - s->born).count());
    i.tokens = s->seq.tokens();
    i.computed = s->computed;
    i.blocks = s->blocks.size();
    i.batches = s->batches;
    out.slots.push_back(i);
  }
  for (const auto &[id, r] : loads_) {
    kvt_batch_info b{};
    set_id(b.req_id, r.slot->id);
    b.src = r.src.empty() ? 0 : uint32_t(handle::tier(r.src[0].block));
    b.dst = KVT_TIER_G1;
    b.batch = id;
    b.blocks = r.src.size();
    b.step = r.step;
    out.batches.push_back(b);
  }
  for (const auto &[id, r] : stores_) {
    kvt_batch_info b{};
    set_id(b.req_id, r.slot->id);
    b.src = KVT_TIER_G1;
    b.dst = uint32_t(r.tier->id());
    b.batch = id;
    b.blocks = r.dst.size();
    b.step = r.step;
    out.batches.push_back(b);
  }
  auto by_id = [](const auto &a, const auto &b) { return std::strcmp(a.req_id, b.req_id) < 0; };
  std::sort(out.slots.begin(), out.slots.end(), by_id);
  std::sort(out.batches.begin(), out.batches.end(),
            [](const kvt_batch_info &a, const kvt_batch_info &b) { return a.batch < b.batch; });
  out.stats = stats_;
  return out;
}

}  // namespace kvt::conn
