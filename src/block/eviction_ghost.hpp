// S3-FIFO's ghost queue: the hashes of blocks evicted from the small queue without a second
// use, so that one registered again soon after goes straight to the main queue. A
// direct-mapped table of 32-bit fingerprints, one entry per slot of the tier rounded up to a
// power of two (4 bytes per block, zero pages until touched): an entry is overwritten by a
// later hash that maps to it, so old entries age out at random rather than strictly first
// in, first out, and a false hit is a 2^-32 chance.
#pragma once

#include <bit>
#include <cstdint>

#include "memory/mapping.hpp"

namespace kvt {

class Ghost {
 public:
  explicit Ghost(uint64_t capacity)
      : bits_(std::bit_width(std::bit_ceil(capacity < 64 ? uint64_t{64} : capacity)) - 1),
        fp_(static_cast<uint32_t *>(map_zeroed(bytes()))) {}
  ~Ghost() { unmap(fp_, bytes()); }
  Ghost(const Ghost &) = delete;
  Ghost &operator=(const Ghost &) = delete;

  void insert(uint64_t hash) noexcept {
    uint64_t m = mix(hash);
    fp_[m >> (64 - bits_)] = fingerprint(m);
  }
  // Whether hash is in the ghost; a hit leaves it.
  bool take(uint64_t hash) noexcept {
    uint64_t m = mix(hash);
    uint32_t &e = fp_[m >> (64 - bits_)];
    if (e != fingerprint(m)) return false;
    e = 0;
    return true;
  }
  uint64_t bytes() const noexcept { return (uint64_t{1} << bits_) * sizeof(uint32_t); }

 private:
  // Spreads small or sequential hashes over the table and the fingerprint.
  static uint64_t mix(uint64_t h) noexcept {
    h ^= h >> 31;
    h *= 0x9E3779B97F4A7C15ull;
    return h ^ (h >> 29);
  }
  static uint32_t fingerprint(uint64_t m) noexcept { return uint32_t(m) | 1; }  // never 0

  unsigned bits_;
  uint32_t *fp_;
};

}  // namespace kvt
