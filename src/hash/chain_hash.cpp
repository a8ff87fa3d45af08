#include "hash/chain_hash.hpp"

#include <bit>
#include <cstring>
#include <vector>

namespace kvt {

uint64_t hash_salt(const void *salt, size_t len) noexcept {
  return XXH3_64bits_withSeed(salt, len, 0);
}

ChainHasher::ChainHasher(uint64_t salt_hash) noexcept
    : seed_(salt_hash), xxh3_(&xxh3()) {
  XXH3_generateSecret_fromSeed(secret_, salt_hash);
}

uint64_t ChainHasher::block(const uint32_t *tokens, size_t n) const noexcept {
  if constexpr (std::endian::native == std::endian::little) {
    return xxh3_->with_secret(tokens, n * 4, secret_, sizeof secret_, seed_);
  } else {
    std::vector<uint32_t> le(tokens, tokens + n);
    for (auto &t : le) t = __builtin_bswap32(t);
    return xxh3_->with_secret(le.data(), n * 4, secret_, sizeof secret_, seed_);
  }
}

uint64_t ChainHasher::chain(uint64_t parent_seq_hash, uint64_t block_hash) const noexcept {
  uint64_t pair[2] = {parent_seq_hash, block_hash};
  if constexpr (std::endian::native != std::endian::little) {
    pair[0] = __builtin_bswap64(pair[0]);
    pair[1] = __builtin_bswap64(pair[1]);
  }
  return XXH3_64bits_withSeed(pair, sizeof pair, seed_);
}

void ChainHasher::sequence(uint64_t *out, const uint32_t *tokens, size_t n_blocks,
                           uint32_t page_size) const noexcept {
  uint64_t parent = 0;
  for (size_t i = 0; i < n_blocks; ++i) {
    uint64_t b = block(tokens + i * page_size, page_size);
    // Block 0 is the sequence hash itself, whatever its value.
    parent = i == 0 ? b : chain(parent, b);
    out[i] = parent;
  }
}

}  // namespace kvt
