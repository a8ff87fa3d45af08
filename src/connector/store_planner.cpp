#include "connector/store_planner.hpp"

#include <algorithm>

#include "block/handle.hpp"
#include "block/tier.hpp"
#include "connector/candidate.hpp"
#include "manager/manager.hpp"

namespace kvt::conn {

StorePlanner::StorePlanner(Manager &m, const kvt_connector_config &c,
                           const std::vector<Slot *> &writer, kvt_connector_stats &stats,
                           uint64_t &next_batch)
    : m_(m), tier_(m.tier_if_present(int(c.store_tier))), writer_(writer), stats_(stats),
      next_batch_(next_batch) {
  if (c.offload == KVT_OFFLOAD_LAZY) content_.resize(c.num_gpu_blocks);
}

StorePlanner::~StorePlanner() {
  for (auto &[id, r] : stores_) release(r.dst);
}

void StorePlanner::release(const std::vector<kvt_block> &blocks) {
  // The planner's own references: failing would be a bug, and there is no caller to tell.
  if (!blocks.empty()) m_.release(blocks.data(), blocks.size());
}

void StorePlanner::reuse(Slot &s, uint32_t g1) {
  if (content_.empty() || !content_[g1].valid) return;
  const Content c = content_[g1];
  content_[g1].valid = false;
  if (!planned_lazy_.empty() && planned_lazy_.back().req_id == s.id) {
    Batch &b = planned_lazy_.back();
    plan_one(g1, c.hash, c.parent, &b.ops, &stores_.at(b.id));
    return;
  }
  Rec rec;
  rec.slot = &s;
  std::vector<CopyOp> ops;
  if (!plan_one(g1, c.hash, c.parent, &ops, &rec)) return;
  const uint64_t id = next_batch_++;
  planned_lazy_.push_back(Batch{id, s.id, std::move(ops)});
  stores_.emplace(id, std::move(rec));
  ++s.batches;
}

void StorePlanner::holds(uint32_t g1, uint64_t hash, uint64_t parent) {
  if (!content_.empty()) content_[g1] = Content{hash, parent, true};
}

void StorePlanner::forget(uint32_t g1) {
  if (!content_.empty()) content_[g1].valid = false;
}

bool StorePlanner::plan_one(uint32_t g1, uint64_t hash, uint64_t parent,
                            std::vector<CopyOp> *ops, Rec *rec) {
  if (storing_.contains(hash) || tier_->contains(hash)) return false;
  kvt_block dst;
  if (tier_->alloc(&dst, 1) != KVT_OK) {
    ++stats_.store_failures;  // every block of the tier is pinned
    return false;
  }
  storing_.insert(hash);
  ops->push_back(CopyOp{g1, uint8_t(tier_->id()), handle::slot(dst), hash, parent});
  rec->dst.push_back(dst);
  rec->hash.push_back(hash);
  rec->parent.push_back(parent);
  return true;
}

// One presence check and one allocation for all of them, so the tier's lock is taken
// twice per step, not twice per block.
void StorePlanner::plan_wanted(Slot &s, Batch *batch, Rec *rec) {
  const auto &hashes = s.seq.seq_hashes();
  want_hash_.resize(want_.size());
  present_.resize(want_.size());
  for (size_t i = 0; i < want_.size(); ++i) want_hash_[i] = hashes[want_[i]];
  tier_->contains_each(want_hash_.data(), want_.size(), present_.data());
  size_t k = 0;
  for (size_t i = 0; i < want_.size(); ++i)
    if (!present_[i]) want_[k++] = want_[i];
  want_.resize(k);
  dst_.resize(k);
  size_t got = k;
  if (k && tier_->alloc(dst_.data(), k) != KVT_OK) {
    // All or nothing refused: as many as the tier can give (the rest is pinned).
    for (got = 0; got < k && tier_->alloc(&dst_[got], 1) == KVT_OK;) ++got;
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
    batch->ops.push_back(
        CopyOp{s.blocks[j], uint8_t(tier_->id()), handle::slot(dst_[i]), hashes[j], parent});
    rec->dst.push_back(dst_[i]);
    rec->hash.push_back(hashes[j]);
    rec->parent.push_back(parent);
  }
  release(unused);
}

void StorePlanner::plan(Slot &s, uint64_t step, Batch *batch) {
  const auto &hashes = s.seq.seq_hashes();
  const size_t full = std::min<size_t>({s.computed / m_.config().page_size, hashes.size(),
                                        s.blocks.size()});
  Rec rec;
  rec.slot = &s;
  const int dst = tier_->id();
  want_.clear();
  for (size_t j = s.store_next; j < full; ++j) {
    // The engine's null block, or one a sliding window left that another request took.
    if (s.blocks[j] == KVT_BLOCK_ID_NONE || writer_[s.blocks[j]] != &s) continue;
    if (!content_.empty())
      content_[s.blocks[j]] = Content{hashes[j], j ? hashes[j - 1] : 0, true};
    else if (!storing_.contains(hashes[j]))
      want_.push_back(j);
  }
  if (!want_.empty()) plan_wanted(s, batch, &rec);
  const size_t considered = full > s.store_next ? full - s.store_next : 0;
  s.store_next = std::max(s.store_next, full);
  if (considered && !content_.empty())  // lazy: stored only when the engine reuses them
    candidate_event(m_.bus(), s, KVT_CANDIDATE_PENDING_EVALUATION, 0, KVT_TIER_G1, dst,
                    considered);
  else if (considered > batch->ops.size())
    candidate_event(m_.bus(), s, KVT_CANDIDATE_SKIPPED, 0, KVT_TIER_G1, dst,
                    considered - batch->ops.size());
  if (batch->ops.empty()) return;
  batch->id = next_batch_++;
  batch->req_id = s.id;
  rec.step = step;
  rec.eager = true;
  stores_.emplace(batch->id, std::move(rec));
  ++s.batches;
  candidate_event(m_.bus(), s, KVT_CANDIDATE_PROMOTED, batch->id, KVT_TIER_G1, dst,
                  batch->ops.size());
}

std::vector<Batch> StorePlanner::take_lazy(uint64_t step) {
  for (const Batch &b : planned_lazy_) {
    Rec &rec = stores_.at(b.id);
    rec.step = step;
    candidate_event(m_.bus(), *rec.slot, KVT_CANDIDATE_PROMOTED, b.id, KVT_TIER_G1,
                    tier_->id(), b.ops.size());
  }
  std::vector<Batch> out = std::move(planned_lazy_);
  planned_lazy_.clear();
  return out;
}

// Async scheduling plans the next step before the failed load's report, so later steps'
// stores go too. Their hashes are free to be planned again as soon as the blocks are
// recomputed, which may be before the cancellations' report.
void StorePlanner::doom(const Slot &s, uint64_t step) {
  for (auto &[id, rec] : stores_) {
    if (rec.slot != &s || rec.step < step || !rec.eager || rec.doomed) continue;
    rec.doomed = true;
    for (uint64_t h : rec.hash) storing_.erase(h);
  }
}

void StorePlanner::reset() {
  for (auto &[id, rec] : stores_) rec.doomed = true;
  storing_.clear();
  for (Content &c : content_) c.valid = false;
}

Acks *StorePlanner::acks(uint64_t id, size_t *ops, bool *sent) {
  auto it = stores_.find(id);
  if (it == stores_.end()) return nullptr;
  *ops = it->second.dst.size();
  *sent = it->second.step != 0;
  return &it->second.acks;
}

Slot *StorePlanner::done(const Report &r, const Done &d, uint32_t world) {
  auto it = stores_.find(d.id);
  Rec &rec = it->second;
  std::vector<uint32_t> fresh;
  if (!rec.acks.add(r, d, rec.dst.size(), world, &fresh)) return nullptr;
  std::vector<kvt_block> done;
  kvt_status first = KVT_OK;
  for (size_t i = 0; i < rec.dst.size(); ++i) {
    if (!rec.doomed) storing_.erase(rec.hash[i]);
    const kvt_status st = rec.acks.failed[i];
    if (first == KVT_OK) first = st;
    kvt_block b = rec.dst[i];
    if (st == KVT_OK && !rec.doomed &&
        tier_->register_hash(&b, rec.dst[i], rec.hash[i], rec.parent[i]) == KVT_OK) {
      ++stats_.stored_blocks;
    } else {
      ++stats_.store_failures;
      b = rec.dst[i];
    }
    done.push_back(b);
  }
  if (m_.bus().on()) {
    const kvt_candidate_state cs = rec.doomed        ? KVT_CANDIDATE_CANCELLED
                                   : first == KVT_OK ? KVT_CANDIDATE_COMPLETED
                                                     : KVT_CANDIDATE_FAILED;
    candidate_event(m_.bus(), *rec.slot, cs, d.id, KVT_TIER_G1, tier_->id(), rec.dst.size(),
                    rec.doomed ? KVT_ERR_CANCELLED : first);
  }
  release(done);
  Slot *s = rec.slot;
  --s->batches;
  stores_.erase(it);
  return s;
}

void StorePlanner::batches(std::vector<kvt_batch_info> *out) const {
  for (const auto &[id, r] : stores_) {
    kvt_batch_info b{};
    copy_id(b.req_id, r.slot->id);
    b.src = KVT_TIER_G1;
    b.dst = uint32_t(tier_->id());
    b.batch = id;
    b.blocks = r.dst.size();
    b.step = r.step;
    out->push_back(b);
  }
}

}  // namespace kvt::conn
