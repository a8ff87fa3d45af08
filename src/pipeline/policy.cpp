#include "pipeline/policy.hpp"

#include <algorithm>

namespace kvt {

namespace {
// Offer counts kept for the frequency policy; past this many hashes they are halved, so
// that old popularity fades (as in TinyLFU).
constexpr size_t kMaxOffered = size_t{1} << 20;
// Blocks evaluated per hold of the in-flight lock, and between looks at the clock.
constexpr size_t kChunk = 256;
// G4 keeps no registry to ask, so its presence check covers what is in flight to it: two
// transfers never write the same key at once.
constexpr kvt_policy kG4Policy{KVT_POLICY_PRESENCE, 1};
}  // namespace

PolicyStage::PolicyStage(const PipelineConfig &c, BlockTiers &tiers)
    : tiers_(tiers), policies_{c.policies[0], c.policies[1], c.policies[2]},
      timeout_(c.policy_timeout) {}

std::vector<uint64_t> PolicyStage::evaluate(Transfer &t) {
  const bool g4 = t.dst_tier == KVT_TIER_G4;
  const kvt_policy &p = g4 ? kG4Policy : policies_[index(*t.dir)];
  auto &offered = offered_[g4 ? 0 : index(*t.dir)];  // unused by kG4Policy
  const auto deadline = Clock::now() + timeout_;
  std::vector<SourceRef> kept;
  std::vector<uint64_t> reserved;
  kept.reserve(t.src.size());
  for (size_t begin = 0; begin < t.src.size(); begin += kChunk) {
    if (begin > 0 && Clock::now() > deadline) break;  // the rest is not offloaded
    const size_t end = std::min(t.src.size(), begin + kChunk);
    std::lock_guard lock(mu_);
    auto &inflight = inflight_[t.dst_tier];
    for (size_t i = begin; i < end; ++i) {
      const SourceRef &r = t.src[i];
      if (p.flags & KVT_POLICY_FREQUENCY) {
        if (offered.size() >= kMaxOffered) {
          for (auto it = offered.begin(); it != offered.end();) {
            if ((it->second /= 2) == 0) offered.erase(it++); else ++it;
          }
        }
        if (++offered[r.hash] < p.min_frequency) continue;
      }
      if ((p.flags & KVT_POLICY_PRESENCE) &&
          (inflight.contains(r.hash) || (!g4 && tiers_.holds(t.dst_tier, r.hash))))
        continue;
      ++inflight[r.hash];
      reserved.push_back(r.hash);
      kept.push_back(r);
    }
  }
  t.src.swap(kept);
  return reserved;
}

void PolicyStage::unreserve(kvt_tier dst, const std::vector<uint64_t> &hashes) {
  auto &inflight = inflight_[dst];
  for (size_t begin = 0; begin < hashes.size(); begin += kChunk) {
    std::lock_guard lock(mu_);
    for (size_t i = begin; i < std::min(hashes.size(), begin + kChunk); ++i) {
      auto it = inflight.find(hashes[i]);
      if (it != inflight.end() && --it->second == 0) inflight.erase(it);
    }
  }
}

}  // namespace kvt
