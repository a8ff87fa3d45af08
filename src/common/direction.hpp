// Transfer directions: the one table of what each direction means. The enum's value indexes
// the per-direction statistics, and the configurable offload directions come first so that
// it also indexes the offload policies. G4's directions come last (0.4.0).
#pragma once

#include <cstdint>
#include <optional>

#include "kvtier.h"

namespace kvt {

enum class Direction : uint8_t {
  G1toG2, G1toG3, G2toG3, G2toG1, G3toG1,
  G1toG4, G2toG4, G3toG4, G4toG1, G4toG2
};
inline constexpr size_t kDirections = 10;
inline constexpr size_t kOffloadDirections = 3;  // with a config policy: G1toG2, G1toG3, G2toG3

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
    {Direction::G1toG4, KVT_TIER_G1, KVT_TIER_G4, "G1 -> G4"},
    {Direction::G2toG4, KVT_TIER_G2, KVT_TIER_G4, "G2 -> G4"},
    {Direction::G3toG4, KVT_TIER_G3, KVT_TIER_G4, "G3 -> G4"},
    {Direction::G4toG1, KVT_TIER_G4, KVT_TIER_G1, "G4 -> G1"},
    {Direction::G4toG2, KVT_TIER_G4, KVT_TIER_G2, "G4 -> G2"},
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
