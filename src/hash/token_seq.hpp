// Incremental token-sequence hasher behind kvt_seq: buffers the tail of a partial block and
// hashes each block as it fills.
#pragma once

#include <cstdint>
#include <vector>

#include "hash/chain_hash.hpp"

namespace kvt {

class TokenSeq {
 public:
  TokenSeq(uint64_t salt_hash, uint32_t page_size);

  void append(const uint32_t *tokens, size_t n);
  size_t tokens() const noexcept { return total_; }
  size_t blocks() const noexcept { return seq_hashes_.size(); }
  const std::vector<uint64_t> &block_hashes() const noexcept { return block_hashes_; }
  const std::vector<uint64_t> &seq_hashes() const noexcept { return seq_hashes_; }
  // The tokens of the block being filled (fewer than page_size).
  const std::vector<uint32_t> &partial() const noexcept { return partial_; }

 private:
  void close_block(const uint32_t *tokens);

  ChainHasher hasher_;
  uint32_t page_size_;
  size_t total_ = 0;
  std::vector<uint32_t> partial_;  // tokens of the block being filled
  std::vector<uint64_t> block_hashes_, seq_hashes_;
};

}  // namespace kvt
