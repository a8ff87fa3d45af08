// The scheduler half's store planner: which of a request's computed blocks go to the store
// tier (eager: as they are computed; lazy: when the engine reuses their G1 blocks), each to
// a new block of that tier, planned once per hash while a store of it is in flight; and
// what the workers' reports make of them (registered, or given back).
#pragma once

#include <absl/container/flat_hash_map.h>
#include <absl/container/flat_hash_set.h>

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

class StorePlanner {
 public:
  // writer: per G1 block, the live slot that writes it (the scheduler's); stats and
  // next_batch: the scheduler's counters and batch ids, shared with the load planner.
  StorePlanner(Manager &m, const kvt_connector_config &c, const std::vector<Slot *> &writer,
               kvt_connector_stats &stats, uint64_t &next_batch);
  ~StorePlanner();  // gives back the destinations of the stores in flight
  StorePlanner(const StorePlanner &) = delete;
  StorePlanner &operator=(const StorePlanner &) = delete;

  Tier &tier() const noexcept { return *tier_; }

  // s now writes G1 block g1. Lazy: whatever full block g1 held is stored first, in s's
  // lazy batch for the next metadata, unless the store tier has it.
  void reuse(Slot &s, uint32_t g1);
  // Lazy: G1 block g1 holds (hash, parent), loaded into it; or nothing worth storing.
  void holds(uint32_t g1, uint64_t hash, uint64_t parent);
  void forget(uint32_t g1);
  // Eager: stores for the full blocks s has computed since the last plan, into *batch, for
  // the metadata of `step`. Lazy: remembers what their G1 blocks hold.
  void plan(Slot &s, uint64_t step, Batch *batch);
  // The lazy batches planned since the last metadata, now that metadata `step` carries them.
  std::vector<Batch> take_lazy(uint64_t step);
  // s's eager stores of `step` and later, in which a load of s failed, are never registered:
  // what they copy was computed over bytes that never arrived.
  void doom(const Slot &s, uint64_t step);
  // kvt_connector_reset_cache: stores in flight end unregistered, and no lazy store of what
  // G1 held is made.
  void reset();

  // A report naming batch `id`: its acks, the copies it has (*ops) and whether a metadata
  // carried it (*sent); null for an unknown batch.
  Acks *acks(uint64_t id, size_t *ops, bool *sent);
  // Rank r's Done d of a batch acks() knew: once the last rank's, registers what arrived,
  // gives back the rest and returns the batch's slot; null before.
  Slot *done(const Report &r, const Done &d, uint32_t world);
  // The stores in flight, for inspection.
  void batches(std::vector<kvt_batch_info> *out) const;

 private:
  struct Rec {
    Slot *slot = nullptr;
    uint64_t step = 0;
    bool eager = false;  // of blocks the slot computed (lazy: of reused G1 blocks)
    // A load of the slot failed in its step: the worker cancels it, and its hashes may be
    // planned again (for the recomputed blocks) before its report comes.
    bool doomed = false;
    std::vector<kvt_block> dst;  // Empty blocks of the store tier, held until the report
    std::vector<uint64_t> hash, parent;
    Acks acks;
  };
  // Plans one store of g1's block (hash, parent) into rec and ops: false when the store tier
  // has it, a store of it is in flight, or no block of the tier can be had.
  bool plan_one(uint32_t g1, uint64_t hash, uint64_t parent, std::vector<CopyOp> *ops,
                Rec *rec);
  // Stores of s's blocks want_ (none in flight) that the store tier lacks.
  void plan_wanted(Slot &s, Batch *batch, Rec *rec);
  void release(const std::vector<kvt_block> &blocks);

  Manager &m_;
  Tier *tier_;
  const std::vector<Slot *> &writer_;
  kvt_connector_stats &stats_;
  uint64_t &next_batch_;
  struct Content {
    uint64_t hash = 0, parent = 0;
    bool valid = false;
  };
  std::vector<Content> content_;  // lazy: what each G1 block holds, until reused; else empty
  absl::flat_hash_map<uint64_t, Rec> stores_;  // by batch id
  absl::flat_hash_set<uint64_t> storing_;      // hashes with a store in flight
  std::vector<Batch> planned_lazy_;            // lazy stores for the next metadata
  // plan()'s scratch, kept between steps: the blocks to store, their hashes, whether the
  // store tier has each, their destinations
  std::vector<size_t> want_;
  std::vector<uint64_t> want_hash_;
  std::vector<uint8_t> present_;
  std::vector<kvt_block> dst_;
};

}  // namespace kvt::conn
