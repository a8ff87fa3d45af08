// The bytes a block with a given sequence hash holds in kvtier-replay: a function of the hash
// alone, so that a block loaded from any tier can be checked.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvt::replay {

inline uint64_t word_of(uint64_t hash, size_t i) {
  return (hash + i * 0x9E3779B97F4A7C15ull) ^ (hash >> 31);
}

inline void fill(void *p, size_t len, uint64_t hash) {
  auto *w = static_cast<uint64_t *>(p);
  for (size_t i = 0; i < len / 8; ++i) w[i] = word_of(hash, i);
}

inline bool holds(const void *p, size_t len, uint64_t hash) {
  auto *w = static_cast<const uint64_t *>(p);
  for (size_t i = 0; i < len / 8; ++i)
    if (w[i] != word_of(hash, i)) return false;
  return true;
}

}  // namespace kvt::replay
