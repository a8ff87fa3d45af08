// Transfer directions: the one table of what each direction means. The enum's value indexes
// the per-direction statistics, and the offload directions come first so that it also
// indexes the offload policies.
#pragma once

#include <cstdint>
#include <optional>

#include "kvtier.h"

namespace kvt {

enum class Direction : uint8_t { G1toG2, G1toG3, G2toG3, G2toG1, G3toG1 };
inline constexpr size_t kDirections = 5;
inline constexpr size_t kOffloadDirections = 3;  // G1toG2, G1toG3, G2toG3

struct DirectionInfo {
  Direction dir;
  kvt_tier src, dst;
  const char *name;
};

inline constexpr DirectionInfo kDirectionTable[kDirections] = {
    {Direction::G1toG2, KVT_TIER_G1, KVT_TIER_G2, "G1 -> G2"},
    {Direction::G1toG3, KVT_TIER_G1, KVT_TIER_G3, "G1 -> G3"},
    {Direction::G2toG3, KVT_TIER_G2, KVT_TIER_G3, "G2 -> G3"},
    {Direction::G2toG1, KVT_TIER_G2, KVT_TIER_G1, "G2 -> G1"},
    {Direction::G3toG1, KVT_TIER_G3, KVT_TIER_G1, "G3 -> G1"},
};

inline constexpr size_t index(Direction d) { return size_t(d); }
inline constexpr const DirectionInfo &info(Direction d) { return kDirectionTable[index(d)]; }

// The direction from src to dst (raw tier numbers), if that pair is one.
inline constexpr std::optional<Direction> direction(int src, int dst) {
  for (const DirectionInfo &d : kDirectionTable)
    if (int(d.src) == src && int(d.dst) == dst) return d.dir;
  return std::nullopt;
}

}  // namespace kvt
