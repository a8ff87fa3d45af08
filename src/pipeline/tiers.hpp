// The pipeline's view of the block tiers: everything it may do to blocks, by batch. The
// manager implements it over its tiers, so that the pipeline depends on this interface only.
// Every reference taken here is the pipeline's own, counted apart from the host's, and goes
// back through release() (or commit_onboarded).
#pragma once

#include <cstddef>
#include <cstdint>

#include "event/event_queue.hpp"
#include "event/obs_sink.hpp"
#include "kvtier.h"
#include "memory/tier_memory.hpp"

namespace kvt {

class BlockTiers {
 public:
  virtual ~BlockTiers() = default;

  virtual const Geometry &geometry() const = 0;
  virtual EventQueue &events() = 0;
  virtual ObsSink &obs() = 0;
  // The bytes of a tier, or nullptr where its blocks hold none here (G3 on disk, G4).
  virtual const TierMemory *memory(kvt_tier t) = 0;

  // Checks at enqueue; no reference is taken. Each failure sets the error message.
  virtual kvt_status present(int t) = 0;                       // a tier of this manager?
  virtual kvt_status tier_of(kvt_block b, kvt_tier *out) = 0;  // a block of this manager?
  virtual kvt_status peek(kvt_block b, uint64_t *hash, uint64_t *parent) = 0;  // registered
  virtual kvt_status expect_empty(kvt_block b) = 0;  // a fresh Empty block (an onboard's)
  virtual bool holds(kvt_tier t, uint64_t hash) = 0;           // hash registered in t

  // Reserve: the weak references of a committed batch become strong. ok[i] says which did
  // (a source evicted since enqueue, or a destination released, does not).
  virtual void retain(kvt_tier t, const kvt_block *b, size_t n, bool *ok) = 0;
  virtual void pin_empty(const kvt_block *b, size_t n, bool *ok) = 0;
  virtual kvt_status alloc(kvt_tier t, kvt_block *out, size_t n) = 0;  // all or nothing

  // Commit: b[i] holding copies of hash[i] are registered; b[i] becomes the block that holds
  // the pipeline's reference afterwards (another one where the hash was there already).
  virtual void store(kvt_tier t, kvt_block *b, const uint64_t *hash, const uint64_t *parent,
                     size_t n) = 0;
  // Onboard: drops the pin on b[i] (G1, or G2 from G4) and registers it; out[i] is the
  // caller's final handle: b[i], or where its tier held the hash already, that block pinned
  // for the host (with pin_existing) or 0 (the copy is dropped, b[i] stays Empty and the
  // caller's).
  virtual void commit_onboarded(kvt_block *out, const kvt_block *b, const uint64_t *hash,
                                const uint64_t *parent, size_t n, bool pin_existing) = 0;
  // The host takes the blocks pinned for it, and gives up replaced[i] (its Empty ones).
  virtual void hand_over(const kvt_block *replaced, size_t n) = 0;
  // A block whose stored copy proved corrupt leaves its tier's registry.
  virtual void remove(kvt_block b) = 0;

  // Release: gives back the pipeline's references.
  virtual void release(const kvt_block *b, size_t n) = 0;
  // The references the pipeline holds, summed over the tiers' own counts.
  virtual uint64_t pipeline_refs() = 0;
};

}  // namespace kvt
