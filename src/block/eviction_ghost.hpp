// S3-FIFO's ghost queue: the hashes of the last `window` blocks evicted from the small queue
// without a second use, so that one registered again soon after goes to the main queue.
// A table of 8-way buckets (one cache line each) of (32-bit fingerprint, insertion number)
// at most 3/4 full: an entry counts while fewer than `window` insertions followed it, which
// is a FIFO of that length, except that a full bucket drops its oldest entry early (rare at
// that load). A false hit is a 2^-32 chance. About 12 bytes per slot of the tier.
#pragma once

#include <bit>
#include <cstdint>

#include "memory/mapping.hpp"

namespace kvt {

class Ghost {
 public:
  explicit Ghost(uint64_t window)
      : window_(uint32_t(window)),
        buckets_(std::bit_ceil((window * 4 / 3 + kWays - 1) / kWays | 1)),
        e_(static_cast<uint64_t *>(map_zeroed(bytes()))) {}
  ~Ghost() { unmap(e_, bytes()); }
  Ghost(const Ghost &) = delete;
  Ghost &operator=(const Ghost &) = delete;

  void insert(uint64_t hash) noexcept {
    uint64_t m = mix(hash);
    uint64_t *b = bucket(m);
    ++now_;
    int victim = 0;
    uint32_t oldest = 0;
    for (int i = 0; i < kWays; ++i) {
      uint32_t age = b[i] == 0 ? UINT32_MAX : now_ - uint32_t(b[i]);
      if (age >= oldest) {
        oldest = age;
        victim = i;
      }
    }
    b[victim] = uint64_t(fingerprint(m)) << 32 | now_;
  }
  // Whether hash is among the last `window` inserted; a hit leaves the ghost.
  bool take(uint64_t hash) noexcept {
    uint64_t m = mix(hash);
    uint64_t *b = bucket(m);
    for (int i = 0; i < kWays; ++i)
      if (uint32_t(b[i] >> 32) == fingerprint(m) && now_ - uint32_t(b[i]) < window_) {
        b[i] = 0;
        return true;
      }
    return false;
  }
  uint64_t bytes() const noexcept { return buckets_ * kWays * sizeof(uint64_t); }

 private:
  static constexpr int kWays = 8;
  // Spreads small or sequential hashes over the buckets and the fingerprint.
  static uint64_t mix(uint64_t h) noexcept {
    h ^= h >> 31;
    h *= 0x9E3779B97F4A7C15ull;
    return h ^ (h >> 29);
  }
  static uint32_t fingerprint(uint64_t m) noexcept { return uint32_t(m) | 1; }  // never 0
  uint64_t *bucket(uint64_t m) const noexcept { return e_ + ((m >> 32) & (buckets_ - 1)) * kWays; }

  const uint32_t window_;
  const uint64_t buckets_;
  uint64_t *e_;
  uint32_t now_ = 0;  // insertions so far, modulo 2^32
};

}  // namespace kvt
