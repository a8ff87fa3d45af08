// The manager's tiers as the pipeline sees them (pipeline/tiers.hpp): every reference taken
// through here is counted as the pipeline's.
#pragma once

#include "pipeline/tiers.hpp"

namespace kvt {

class Manager;

class PipelineTiers final : public BlockTiers {
 public:
  explicit PipelineTiers(Manager &m) : m_(m) {}

  const Geometry &geometry() const override;
  EventQueue &events() override;
  ObsSink &obs() override;
  const TierMemory *memory(kvt_tier t) override;
  kvt_status present(int t) override;
  kvt_status tier_of(kvt_block b, kvt_tier *out) override;
  kvt_status peek(kvt_block b, uint64_t *hash, uint64_t *parent) override;
  kvt_status expect_empty(kvt_block b) override;
  bool holds(kvt_tier t, uint64_t hash) override;
  void retain(kvt_tier t, const kvt_block *b, size_t n, bool *ok) override;
  void pin_empty(const kvt_block *b, size_t n, bool *ok) override;
  kvt_status alloc(kvt_tier t, kvt_block *out, size_t n) override;
  void store(kvt_tier t, kvt_block *b, const uint64_t *hash, const uint64_t *parent,
             size_t n) override;
  void commit_onboarded(kvt_block *out, const kvt_block *b, const uint64_t *hash,
                        const uint64_t *parent, size_t n, bool pin_existing) override;
  void hand_over(const kvt_block *replaced, size_t n) override;
  void remove(kvt_block b) override;
  void release(const kvt_block *b, size_t n) override;
  uint64_t pipeline_refs() override;

 private:
  Manager &m_;
};

}  // namespace kvt
