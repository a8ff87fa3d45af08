// The scheduler half's load planner: the hit of a request in G2 and G3 (a prefix, or a
// sliding window's blocks), pinned and staged in its slot until the engine allocates for
// it; the loads that then wait for the next metadata; and what the workers' reports make
// of them.
#pragma once

#include <absl/container/flat_hash_map.h>

#include <cstdint>
#include <vector>

#include "connector/acks.hpp"
#include "connector/metadata.hpp"
#include "connector/slot.hpp"
#include "kvtier.h"

namespace kvt {
class Manager;
class Tier;
}  // namespace kvt

namespace kvt::conn {

class StorePlanner;

class LoadPlanner {
 public:
  // window_blocks: a sliding window's blocks before a hit's end, 0 for full attention.
  // stats, next_batch and stores: the scheduler's counters, batch ids and store planner.
  LoadPlanner(Manager &m, const kvt_connector_config &c, size_t window_blocks,
              kvt_connector_stats &stats, uint64_t &next_batch, StorePlanner &stores);
  ~LoadPlanner();  // unpins the sources of the loads in flight
  LoadPlanner(const LoadPlanner &) = delete;
  LoadPlanner &operator=(const LoadPlanner &) = delete;

  // The hit among blocks [first, usable) of hashes, pinned, each block where it is (G2
  // first): a prefix from first, or with a sliding window the blocks of the window before
  // the hit's end. *from: its first block.
  kvt_status hit(std::vector<Pinned> *out, size_t *from, const std::vector<uint64_t> &hashes,
                 size_t first, size_t usable);
  // s stages hit (its first block: from) until the engine allocates for it; the staged hit
  // is let go (SKIPPED) by drop_staged.
  void stage(Slot &s, std::vector<Pinned> hit, size_t from);
  void drop_staged(Slot &s);
  // The engine took s's staged hit into G1 blocks `blocks` (its block from staged_from on):
  // one load batch for the next metadata.
  void plan(Slot &s, const uint32_t *blocks);
  // s's loads not yet in a metadata are cancelled.
  void drop_planned(Slot &s);
  // The loads planned since the last metadata, now that metadata `step` carries them.
  std::vector<Batch> take_planned(uint64_t step);
  bool in_flight() const noexcept { return !loads_.empty(); }
  size_t count() const noexcept { return loads_.size(); }

  // A report naming batch `id`, as StorePlanner::acks.
  Acks *acks(uint64_t id, size_t *ops, bool *sent);
  // Rank r's Done d of a batch acks() knew. A copy that failed leaves the registry at once
  // and dooms the slot's stores of that step. Once the last rank's: unpins the sources and
  // returns the batch's slot; null before.
  Slot *done(const Report &r, const Done &d, uint32_t world);
  // The loads in flight or planned, for inspection.
  void batches(std::vector<kvt_batch_info> *out) const;

 private:
  struct Rec {
    Slot *slot = nullptr;
    uint64_t step = 0;        // the metadata that carried it; 0: planned for the next one
    bool async = false;       // the engine waits for finished_recving, not the step
    std::vector<Pinned> src;  // pinned until the last rank's report
    std::vector<uint32_t> g1;
    Acks acks;
  };
  kvt_status match_prefix(std::vector<Pinned> *out, const std::vector<uint64_t> &hashes,
                          size_t first, size_t usable);
  kvt_status match_window(std::vector<Pinned> *out, size_t *from,
                          const std::vector<uint64_t> &hashes, size_t first, size_t usable);
  void release(const std::vector<kvt_block> &blocks);
  void unpin(std::vector<Pinned> *hit);

  Manager &m_;
  Tier *tiers_[2];  // where hits are looked for, in order (null if absent)
  const size_t window_blocks_;
  const bool async_;
  kvt_connector_stats &stats_;
  uint64_t &next_batch_;
  StorePlanner &stores_;
  absl::flat_hash_map<uint64_t, Rec> loads_;  // by batch id
  std::vector<uint64_t> planned_;             // batch ids for the next metadata
};

}  // namespace kvt::conn
