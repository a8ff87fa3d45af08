// Chained xxh3-64 block hashing (DESIGN section 4), shared by kvt_hash_*, kvt_seq and the
// token path of the block lifecycle.
#pragma once

#include <cstddef>
#include <cstdint>

#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include "hash/xxh3_wide.hpp"

namespace kvt {

uint64_t hash_salt(const void *salt, size_t len) noexcept;

// Hashes blocks under one salt. Long blocks (over 240 bytes) would make XXH3 derive a
// secret from the seed on every call; deriving it once per salt gives the same hashes
// for a fraction of the cost.
class ChainHasher {
 public:
  explicit ChainHasher(uint64_t salt_hash) noexcept;

  // Hash of one block's tokens, as little-endian u32.
  uint64_t block(const uint32_t *tokens, size_t n) const noexcept;
  // Sequence hash of a block that has a parent (every block but a sequence's first).
  uint64_t chain(uint64_t parent_seq_hash, uint64_t block_hash) const noexcept;
  // Sequence hashes of the n_blocks full blocks of tokens, starting a new sequence.
  void sequence(uint64_t *out, const uint32_t *tokens, size_t n_blocks,
                uint32_t page_size) const noexcept;

 private:
  uint64_t seed_;
  const Xxh3 *xxh3_;
  unsigned char secret_[XXH3_SECRET_DEFAULT_SIZE];
};

}  // namespace kvt
