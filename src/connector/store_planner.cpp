// The scheduler half's store planner: which of a request's computed blocks go to the store
// tier (eager: as they are computed; lazy: when the engine reuses their G1 blocks), each to
// a new block of that tier, planned once per hash while a store of it is in flight.
#include "connector/scheduler.hpp"

#include <algorithm>
#include <cstring>

#include "block/handle.hpp"
#include "block/tier.hpp"
#include "common/error.hpp"
#include "common/names.hpp"
#include "manager/manager.hpp"

namespace kvt::conn {

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

// Blocks s wrote are the engine's again.
void Scheduler::unclaim(Slot &s) {
  for (uint32_t b : s.blocks)
    if (b != KVT_BLOCK_ID_NONE && writer_[b] == &s) writer_[b] = nullptr;
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

}  // namespace kvt::conn
