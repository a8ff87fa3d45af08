// The policy stage: which blocks of an offload are worth moving (frequency, presence), and
// the in-flight set that keeps two transfers from moving the same hash to the same tier.
// Evaluation runs on the progress thread without any lock that polling calls need; the
// in-flight set has its own lock, taken a few hundred blocks at a time.
#pragma once

#include <absl/container/flat_hash_map.h>

#include <mutex>
#include <vector>

#include "kvtier.h"
#include "pipeline/config.hpp"
#include "pipeline/tiers.hpp"
#include "pipeline/transfer.hpp"

namespace kvt {

class PolicyStage {
 public:
  PolicyStage(const PipelineConfig &c, BlockTiers &tiers);

  // Filters t.src (which only the caller touches) by the policy of t's direction and
  // reserves the kept hashes in the in-flight set. Returns the reserved hashes. Blocks left
  // when the policy timeout expires are not offloaded.
  std::vector<uint64_t> evaluate(Transfer &t);
  void unreserve(kvt_tier dst, const std::vector<uint64_t> &hashes);

 private:
  BlockTiers &tiers_;
  const kvt_policy policies_[kOffloadDirections];  // G4's directions: presence, in flight only
  const Clock::duration timeout_;
  // Offer counts of the frequency policy, per offload direction: the progress thread only.
  absl::flat_hash_map<uint64_t, uint32_t> offered_[kOffloadDirections];
  std::mutex mu_;  // guards inflight_; taken before a tier's lock
  absl::flat_hash_map<uint64_t, uint32_t> inflight_[5];  // per destination tier
};

}  // namespace kvt
