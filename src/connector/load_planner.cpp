#include "connector/load_planner.hpp"

#include <algorithm>

#include "block/handle.hpp"
#include "block/tier.hpp"
#include "connector/candidate.hpp"
#include "connector/store_planner.hpp"
#include "manager/manager.hpp"

namespace kvt::conn {

LoadPlanner::LoadPlanner(Manager &m, const kvt_connector_config &c, size_t window_blocks,
                         kvt_connector_stats &stats, uint64_t &next_batch, StorePlanner &stores)
    : m_(m), tiers_{m.tier_if_present(KVT_TIER_G2), m.tier_if_present(KVT_TIER_G3)},
      window_blocks_(window_blocks), async_(c.load_async != 0), stats_(stats),
      next_batch_(next_batch), stores_(stores) {}

LoadPlanner::~LoadPlanner() {
  for (auto &[id, r] : loads_) unpin(&r.src);
}

void LoadPlanner::release(const std::vector<kvt_block> &blocks) {
  // The planner's own references: failing would be a bug, and there is no caller to tell.
  if (!blocks.empty()) m_.release(blocks.data(), blocks.size());
}

void LoadPlanner::unpin(std::vector<Pinned> *hit) {
  for (const Pinned &p : *hit) release({p.block});
  hit->clear();
}

kvt_status LoadPlanner::hit(std::vector<Pinned> *out, size_t *from,
                            const std::vector<uint64_t> &hashes, size_t first, size_t usable) {
  return window_blocks_ ? match_window(out, from, hashes, first, usable)
                        : match_prefix(out, hashes, first, usable);
}

// Eviction moves a prefix's oldest blocks down to G3 while its newest stay in G2: each block
// is taken where it is, G2 first.
kvt_status LoadPlanner::match_prefix(std::vector<Pinned> *out, const std::vector<uint64_t> &hashes,
                                     size_t first, size_t usable) {
  std::vector<kvt_block> got(usable - first);
  for (size_t at = first; at < usable;) {
    size_t k = 0;
    for (Tier *t : tiers_) {
      if (t == nullptr || k) continue;
      if (kvt_status st = t->match(&k, got.data(), &hashes[at], usable - at); st != KVT_OK) {
        unpin(out);
        return st;
      }
    }
    if (k == 0) break;  // in no tier: the prefix ends here
    for (size_t i = 0; i < k; ++i)
      out->push_back(Pinned{got[i], hashes[at + i], at + i ? hashes[at + i - 1] : 0});
    at += k;
  }
  return KVT_OK;
}

// A sliding window's hit, as vLLM's SlidingWindowManager finds its own: the largest end e
// whose window_blocks_ blocks before it (those from first on; the engine holds the rest)
// are each in G2 or G3. Tokens before the window are never read again, so their blocks
// need not be anywhere.
kvt_status LoadPlanner::match_window(std::vector<Pinned> *out, size_t *from,
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
      unpin(out);
      return KVT_OK;
    }
    out->push_back(Pinned{b, hashes[j], j ? hashes[j - 1] : 0});
  }
  return KVT_OK;
}

void LoadPlanner::stage(Slot &s, std::vector<Pinned> hit, size_t from) {
  s.staged = std::move(hit);
  s.staged_from = from;
  if (!s.staged.empty())
    candidate_event(m_.bus(), s, KVT_CANDIDATE_PENDING_EVALUATION, 0,
                    handle::tier(s.staged[0].block), KVT_TIER_G1, s.staged.size());
}

void LoadPlanner::drop_staged(Slot &s) {
  if (!s.staged.empty())
    candidate_event(m_.bus(), s, KVT_CANDIDATE_SKIPPED, 0, handle::tier(s.staged[0].block),
                    KVT_TIER_G1, s.staged.size());
  std::vector<kvt_block> pins;
  for (const Pinned &p : s.staged) pins.push_back(p.block);
  release(pins);
  s.staged.clear();
}

void LoadPlanner::plan(Slot &s, const uint32_t *blocks) {
  Rec rec;
  rec.slot = &s;
  rec.async = async_;
  s.async_loads += rec.async;
  for (size_t i = 0; i < s.staged.size(); ++i) {
    const uint32_t g1 = blocks[s.staged_from + i];
    rec.g1.push_back(g1);
    stores_.holds(g1, s.staged[i].hash, s.staged[i].parent);
  }
  const uint64_t id = next_batch_++;
  candidate_event(m_.bus(), s, KVT_CANDIDATE_PROMOTED, id, handle::tier(s.staged[0].block),
                  KVT_TIER_G1, s.staged.size());
  rec.src = std::move(s.staged);
  s.staged.clear();
  loads_.emplace(id, std::move(rec));
  planned_.push_back(id);
  ++s.batches;
}

void LoadPlanner::drop_planned(Slot &s) {
  auto keep = planned_.begin();
  for (uint64_t id : planned_) {
    auto it = loads_.find(id);
    if (it->second.slot != &s) {
      *keep++ = id;
      continue;
    }
    std::vector<kvt_block> pins;
    for (const Pinned &p : it->second.src) pins.push_back(p.block);
    candidate_event(m_.bus(), s, KVT_CANDIDATE_CANCELLED, id, handle::tier(pins[0]), KVT_TIER_G1,
                    pins.size(), KVT_ERR_CANCELLED);
    release(pins);
    if (it->second.async) --s.async_loads;
    loads_.erase(it);
    --s.batches;
  }
  planned_.erase(keep, planned_.end());
}

std::vector<Batch> LoadPlanner::take_planned(uint64_t step) {
  std::vector<Batch> out;
  for (uint64_t id : planned_) {
    Rec &rec = loads_.at(id);
    rec.step = step;
    Batch b{id, rec.slot->id, {}};
    for (size_t i = 0; i < rec.src.size(); ++i) {
      const Pinned &p = rec.src[i];
      b.ops.push_back(CopyOp{rec.g1[i], uint8_t(handle::tier(p.block)), handle::slot(p.block),
                             p.hash, p.parent});
    }
    out.push_back(std::move(b));
  }
  planned_.clear();
  return out;
}

Acks *LoadPlanner::acks(uint64_t id, size_t *ops, bool *sent) {
  auto it = loads_.find(id);
  if (it == loads_.end()) return nullptr;
  *ops = it->second.src.size();
  *sent = it->second.step != 0;
  return &it->second.acks;
}

Slot *LoadPlanner::done(const Report &r, const Done &d, uint32_t world) {
  auto it = loads_.find(d.id);
  Rec &rec = it->second;
  const bool failed_before = rec.acks.any_failed;
  std::vector<uint32_t> fresh;
  const bool last = rec.acks.add(r, d, rec.src.size(), world, &fresh);
  for (uint32_t op : fresh) {
    // A copy that failed (its checksum, an I/O error, on any rank) leaves the registry at
    // once: no match serves it, and the engine's recompute is not matched to it again and
    // again. Its pin holds the block until the last rank's report.
    m_.tier_of(rec.src[op].block)->remove(rec.src[op].block);
    stores_.forget(rec.g1[op]);
  }
  if (rec.acks.any_failed && !failed_before) stores_.doom(*rec.slot, rec.step);
  if (!last) return nullptr;
  std::vector<kvt_block> pins;
  kvt_status first = KVT_OK;
  for (size_t i = 0; i < rec.src.size(); ++i) {
    pins.push_back(rec.src[i].block);
    const kvt_status st = rec.acks.failed[i];
    ++(st != KVT_OK ? stats_.load_errors : stats_.loaded_blocks);
    if (first == KVT_OK) first = st;
  }
  candidate_event(m_.bus(), *rec.slot,
                  first == KVT_OK ? KVT_CANDIDATE_COMPLETED : KVT_CANDIDATE_FAILED, d.id,
                  handle::tier(pins[0]), KVT_TIER_G1, pins.size(), first);
  release(pins);
  Slot *s = rec.slot;
  if (rec.async) --s->async_loads;
  --s->batches;
  loads_.erase(it);
  return s;
}

void LoadPlanner::batches(std::vector<kvt_batch_info> *out) const {
  for (const auto &[id, r] : loads_) {
    kvt_batch_info b{};
    copy_id(b.req_id, r.slot->id);
    b.src = r.src.empty() ? 0 : uint32_t(handle::tier(r.src[0].block));
    b.dst = KVT_TIER_G1;
    b.batch = id;
    b.blocks = r.src.size();
    b.step = r.step;
    out->push_back(b);
  }
}

}  // namespace kvt::conn
