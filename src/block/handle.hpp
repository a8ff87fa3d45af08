// Block handle encoding: | generation:20 | manager tag:14 | tier:2 | slot:28 |.
// The tag is never 0, so no valid handle is 0; it also tells one manager's handles from
// another's. The generation changes whenever a slot is freed or evicted, so old handles
// to it go stale.
#pragma once

#include <cstdint>

namespace kvt::handle {

inline constexpr unsigned kSlotBits = 28, kTierBits = 2, kTagBits = 14, kGenBits = 20;
inline constexpr uint64_t kSlotMask = (uint64_t{1} << kSlotBits) - 1;
inline constexpr uint64_t kTagMask = (uint64_t{1} << kTagBits) - 1;
inline constexpr uint32_t kGenMask = (uint32_t{1} << kGenBits) - 1;
inline constexpr unsigned kTierShift = kSlotBits, kTagShift = kTierShift + kTierBits,
                          kGenShift = kTagShift + kTagBits;
static_assert(kGenShift + kGenBits == 64);

inline constexpr uint64_t make(uint32_t tag, unsigned tier, uint32_t slot, uint32_t gen) {
  return (uint64_t{gen & kGenMask} << kGenShift) | (uint64_t{tag} << kTagShift) |
         (uint64_t{tier} << kTierShift) | slot;
}
inline constexpr uint32_t slot(uint64_t h) { return uint32_t(h & kSlotMask); }
inline constexpr unsigned tier(uint64_t h) { return unsigned(h >> kTierShift) & 3u; }
inline constexpr uint32_t tag(uint64_t h) { return uint32_t((h >> kTagShift) & kTagMask); }
inline constexpr uint32_t gen(uint64_t h) { return uint32_t(h >> kGenShift) & kGenMask; }

}  // namespace kvt::handle
