// Block handle encoding: | generation:28 | manager tag:8 | tier:2 | slot:26 |.
// The tier is 1..3, so no valid handle is 0. The tag tells one live manager's handles from
// another's (tags are unique among live managers: see tag_pool.hpp). The generation changes
// whenever a slot's block is freed or evicted, so old handles to it go stale; a slot that
// has used its last generation is retired rather than wrapped, so no stale handle ever
// becomes valid again.
#pragma once

#include <cstdint>

#include "kvtier.h"

namespace kvt::handle {

inline constexpr unsigned kSlotBits = 26, kTierBits = 2, kTagBits = 8, kGenBits = 28;
inline constexpr uint64_t kSlotMask = (uint64_t{1} << kSlotBits) - 1;
inline constexpr uint64_t kTagMask = (uint64_t{1} << kTagBits) - 1;
inline constexpr uint32_t kGenMask = (uint32_t{1} << kGenBits) - 1;
inline constexpr uint32_t kLastGen = kGenMask;  // a slot at it retires when its block goes
inline constexpr uint32_t kTags = uint32_t{1} << kTagBits;
inline constexpr unsigned kTierShift = kSlotBits, kTagShift = kTierShift + kTierBits,
                          kGenShift = kTagShift + kTagBits;
static_assert(kGenShift + kGenBits == 64);
static_assert(KVT_MAX_TIER_BLOCKS == kSlotMask && KVT_MAX_MANAGERS == kTags);
// Two tier bits hold 1..3 and no more: no handle can name G4, which has no blocks.
static_assert(KVT_TIER_G3 == (1u << kTierBits) - 1 && KVT_TIER_G4 > KVT_TIER_G3);

inline constexpr uint64_t make(uint32_t tag, unsigned tier, uint32_t slot, uint32_t gen) {
  return (uint64_t{gen & kGenMask} << kGenShift) | (uint64_t{tag & kTagMask} << kTagShift) |
         (uint64_t{tier} << kTierShift) | (slot & kSlotMask);
}
inline constexpr uint32_t slot(uint64_t h) { return uint32_t(h & kSlotMask); }
inline constexpr unsigned tier(uint64_t h) { return unsigned(h >> kTierShift) & 3u; }
inline constexpr uint32_t tag(uint64_t h) { return uint32_t((h >> kTagShift) & kTagMask); }
inline constexpr uint32_t gen(uint64_t h) { return uint32_t(h >> kGenShift) & kGenMask; }

}  // namespace kvt::handle
