#include "connector/log_replay.hpp"

#include <cstdarg>
#include <cstdio>
#include <cstring>

#include "block/tier.hpp"
#include "common/names.hpp"
#include "connector/slot.hpp"
#include "manager/manager.hpp"

namespace kvt::conn {

void LogReplay::violation(const char *fmt, ...) {
  ++violations_;
  if (!first_.empty()) return;
  char b[512];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(b, sizeof b, fmt, ap);
  va_end(ap);
  first_ = "event #" + std::to_string(last_seq_) + ": " + b;
}

void LogReplay::stored(uint32_t tier, uint64_t hash, uint64_t parent) {
  if (tier < KVT_TIER_G1 || tier > KVT_TIER_G3)
    return violation("BLOCK_STORED names tier %u", tier);
  if (!registered_[tier].insert(hash).second)
    return violation("G%u stores hash %016llx, which it holds already", tier,
                     (unsigned long long)hash);
  if (m_ == nullptr) return;
  Tier *t = m_->tier_if_present(int(tier));
  kvt_block b = 0, r = 0;
  if (t != nullptr && t->contains(hash))
    return violation("the manager's G%u holds hash %016llx already: it is not fresh", tier,
                     (unsigned long long)hash);
  if (t == nullptr || t->alloc(&b, 1) != KVT_OK)
    return violation("the fresh manager has no room in G%u for hash %016llx", tier,
                     (unsigned long long)hash);
  if (t->register_hash(&r, b, hash, parent) != KVT_OK) {
    m_->release(&b, 1);
    return violation("the fresh manager's G%u refused hash %016llx", tier,
                     (unsigned long long)hash);
  }
  m_->release(&r, 1);
}

void LogReplay::removed(uint32_t tier, uint64_t hash) {
  if (tier < KVT_TIER_G1 || tier > KVT_TIER_G3)
    return violation("BLOCK_REMOVED names tier %u", tier);
  if (registered_[tier].erase(hash) == 0)
    return violation("G%u removes hash %016llx, which it does not hold", tier,
                     (unsigned long long)hash);
  if (m_ == nullptr) return;
  Tier *t = m_->tier_if_present(int(tier));
  size_t k = 0;
  kvt_block b = 0;
  if (t == nullptr || t->match(&k, &b, &hash, 1) != KVT_OK || k != 1)
    return violation("the fresh manager's G%u lacks hash %016llx", tier,
                     (unsigned long long)hash);
  t->remove(b);
  m_->release(&b, 1);
}

void LogReplay::apply(const kvt_obs_event &e) {
  ++events_;
  if (last_seq_ != 0 && e.seq != last_seq_ + 1)
    violation("sequence number %llu follows %llu", (unsigned long long)e.seq,
              (unsigned long long)last_seq_);
  if (e.seq) last_seq_ = e.seq;
  const std::string id = e.req_id;
  switch (e.kind) {
    case KVT_OBS_SLOT: {
      auto it = slots_.find(id);
      const uint32_t now = it == slots_.end() ? 0 : it->second;
      if (e.prev != now)
        return violation("request '%s' moves from %s, but it is %s", id.c_str(),
                         slot_state_name(e.prev), now ? slot_state_name(now) : "not a live slot");
      if (e.state < KVT_SLOT_INITIALIZED || e.state > KVT_SLOT_FINISHED ||
          (now == 0 ? e.state != KVT_SLOT_INITIALIZED : !legal(SlotState(now), SlotState(e.state))))
        return violation("request '%s': %s -> %s is not a transition of seed 004", id.c_str(),
                         now ? slot_state_name(now) : "(new)", slot_state_name(e.state));
      ++transitions_[now][e.state];
      if (e.state == KVT_SLOT_FINISHED) {
        slots_.erase(id);
        ++finished_;
      } else {
        slots_[id] = e.state;
      }
      return;
    }
    case KVT_OBS_CANDIDATE:
      if (e.batch == 0) return;  // evaluated or skipped blocks, in no batch
      if (e.state == KVT_CANDIDATE_PROMOTED) {
        if (!batches_.insert(e.batch).second)
          violation("batch %llu is promoted twice", (unsigned long long)e.batch);
      } else if (e.state == KVT_CANDIDATE_COMPLETED || e.state == KVT_CANDIDATE_FAILED ||
                 e.state == KVT_CANDIDATE_CANCELLED) {
        if (batches_.erase(e.batch) == 0)
          violation("batch %llu ends without being in flight", (unsigned long long)e.batch);
        if (e.state == KVT_CANDIDATE_COMPLETED && e.dst == KVT_TIER_G1) loaded_ += e.blocks;
      }
      return;
    case KVT_OBS_BLOCK_STORED:
      return stored(e.dst, e.hash, e.parent_hash);
    case KVT_OBS_BLOCK_REMOVED:
      return removed(e.dst, e.hash);
    case KVT_OBS_TIER_CLEARED:
      if (e.dst >= KVT_TIER_G1 && e.dst <= KVT_TIER_G3 && !registered_[e.dst].empty())
        violation("G%u is cleared with %zu blocks it never removed", e.dst,
                  registered_[e.dst].size());
      return;
    case KVT_OBS_DROPPED:
      return violation("the log lost %llu events", (unsigned long long)e.count);
    default:
      return;
  }
}

void LogReplay::result(kvt_log_replay *out, std::string *first) const {
  out->events = events_;
  out->violations = violations_;
  out->live_slots = slots_.size();
  out->finished_slots = finished_;
  out->open_batches = batches_.size();
  out->loaded_blocks = loaded_;
  std::memcpy(out->transitions, transitions_, sizeof transitions_);
  for (int t = 0; t < 4; ++t) out->registered[t] = registered_[t].size();
  *first = first_;
}

}  // namespace kvt::conn
