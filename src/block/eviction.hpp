// A tier's evictable set and what decides its order: a priority per registered block (lower
// evicted first), pins (never evicted), and the policy that orders blocks of equal priority
// (LRU, or S3-FIFO in eviction_s3fifo.cpp). The Tier calls it under its lock at each change
// of a registered block: registered, taken (a new reference), released (no reference left),
// dropped (leaves the registry other than by eviction), and victim to evict.
//
// Blocks of priority 0 that nobody pinned, under LRU, need nothing beyond one list: that
// case never reads the per-block marks, so that it costs what the tier's single LRU list
// cost before priorities existed.
#pragma once

#include <absl/container/flat_hash_map.h>

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "block/eviction_ghost.hpp"
#include "block/eviction_queue.hpp"
#include "block/slot.hpp"
#include "kvtier.h"

namespace kvt {

struct EvictionConfig {
  kvt_eviction policy = KVT_EVICT_LRU;
  uint32_t max_pinned_percent = 50;
};

class Evictor {
 public:
  Evictor(Slot *const *slots, kvt_tier tier, uint64_t capacity, EvictionConfig cfg);
  ~Evictor();
  Evictor(const Evictor &) = delete;
  Evictor &operator=(const Evictor &) = delete;

  uint64_t evictable() const noexcept { return n_evictable_; }
  uint64_t pinned() const noexcept { return n_pinned_; }
  uint64_t bytes() const noexcept;

  // Slot s was just registered under hash (S3-FIFO: a ghost hit sends it to main).
  void registered(uint32_t s, uint64_t hash) noexcept {
    if (ghost_) marks_[s] = ghost_->take(hash) ? kMain : 0;
  }
  // A reference was taken on registered block s, which was inactive or not (a use).
  void taken(uint32_t s, bool was_inactive) noexcept {
    if (!plain()) return taken_marked(s, was_inactive);
    if (was_inactive) {
      level0_.q[0].unlink(*slots_, s);
      --n_evictable_;
    }
  }
  // Registered block s has just become inactive: it joins the evictable set unless pinned.
  void released(uint32_t s) noexcept {
    if (!plain()) return released_marked(s);
    level0_.q[0].push_back(*slots_, s);
    ++n_evictable_;
  }
  // Registered block s leaves the registry other than by victim(), still in its state
  // (Registered or Inactive): out of the evictable set, its pin and priority forgotten.
  void dropped(uint32_t s) noexcept;
  // The next block to evict (evictable() > 0), out of the set, its marks forgotten.
  uint32_t victim() noexcept;
  // The next max blocks in eviction order, without changing anything.
  std::vector<uint32_t> order(size_t max) const;

  // ---- kvt_block_pin / unpin / set_priority, for registered blocks, all or nothing: the
  // caller validates every block, calls prepare (may throw: nothing changed), then stages
  // each pin and admits them (tier by tier), and commits each, or unstages each if refused.
  void prepare_marks();
  bool stage_pin(uint32_t s) noexcept;  // true: a new pin, to count against the share
  kvt_status admit_pins(uint64_t staged) const noexcept;
  void unstage_pin(uint32_t s) noexcept;
  void commit_pin(uint32_t s) noexcept;
  void unpin(uint32_t s) noexcept;
  void prepare_priority(int32_t priority, size_t n);
  void unprepare_priority(int32_t priority) noexcept;  // after a prepare that threw
  void set_priority(uint32_t s, int32_t priority) noexcept;

  // The structures against the slots: queues, levels, marks and counts. inactive: the
  // tier's count of Inactive slots; high_water: slots at or above it were never used.
  kvt_status check(uint32_t high_water, uint64_t inactive) const;

 private:
  // Per-block marks, one byte per slot, mapped on first need (always for S3-FIFO).
  static constexpr uint8_t kPinned = 1, kStaged = 2, kPrio = 4, kMain = 8;
  static constexpr unsigned kFreqShift = 4;
  static constexpr uint8_t kFreqMask = 3 << kFreqShift;
  static unsigned freq(uint8_t m) noexcept { return (m & kFreqMask) >> kFreqShift; }
  static int queue_of(uint8_t m) noexcept { return (m & kMain) ? 1 : 0; }

  // No pins, no priorities, LRU: every mark is 0 and every evictable block is in level0_.
  bool plain() const noexcept { return !ghost_ && n_pinned_ == 0 && prio_.empty(); }
  void taken_marked(uint32_t s, bool was_inactive) noexcept;
  void released_marked(uint32_t s) noexcept;
  bool listed(uint32_t s) const noexcept;  // in one of the queues
  int32_t priority(uint32_t s) const noexcept;
  Level &level(int32_t priority) noexcept;
  const Level *level_if(int32_t priority) const noexcept;
  Level &lowest() noexcept;  // the lowest priority level with an evictable block
  void forget(uint32_t s) noexcept;
  void order_level(const Level &l, size_t max, std::vector<uint32_t> &out) const;
  // eviction_s3fifo.cpp
  uint32_t s3_victim(Level &l) noexcept;
  static void s3_released(uint8_t &m) noexcept;
  void s3_order(const Level &l, size_t max, std::vector<uint32_t> &out) const;

  Slot *const *slots_;
  const kvt_tier tier_;
  const uint64_t capacity_;
  const uint64_t pin_limit_;
  const uint32_t max_pinned_percent_;
  uint8_t *marks_ = nullptr;
  std::unique_ptr<Ghost> ghost_;  // S3-FIFO only
  Level level0_;
  std::map<int32_t, Level> levels_;              // priorities other than 0 that blocks hold
  absl::flat_hash_map<uint32_t, int32_t> prio_;  // slot -> priority, for priorities not 0
  uint64_t n_evictable_ = 0, n_pinned_ = 0;
};

}  // namespace kvt
