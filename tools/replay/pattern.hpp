// The bytes a block with a given sequence hash holds in kvtier-replay: a function of the hash
// alone, so that a block loaded from any tier can be checked.
#pragma once

#include <cstddef>
#include <cstdint>

// Also compiled for the device (g1_bytes_cuda.cu), where a kernel writes G1's blocks.
#ifdef __CUDACC__
#define KVT_REPLAY_HD __host__ __device__
#else
#define KVT_REPLAY_HD
#endif

namespace kvt::replay {

KVT_REPLAY_HD inline uint64_t word_of(uint64_t hash, size_t i) {
  return (hash + i * 0x9E3779B97F4A7C15ull) ^ (hash >> 31);
}

inline void fill(void *p, size_t len, uint64_t hash) {
  auto *w = static_cast<uint64_t *>(p);
  for (size_t i = 0; i < len / 8; ++i) w[i] = word_of(hash, i);
}

// Bytes [from, from + len) of a block's pattern, at block + from: a part of a block (a layer
// of a block-contiguous G1) written alone ends as fill would have written it. from: a
// multiple of 8.
inline void fill_range(void *block, size_t from, size_t len, uint64_t hash) {
  auto *w = static_cast<uint64_t *>(block);
  for (size_t i = from / 8; i < (from + len) / 8; ++i) w[i] = word_of(hash, i);
}

inline bool holds(const void *p, size_t len, uint64_t hash) {
  auto *w = static_cast<const uint64_t *>(p);
  for (size_t i = 0; i < len / 8; ++i)
    if (w[i] != word_of(hash, i)) return false;
  return true;
}

}  // namespace kvt::replay
