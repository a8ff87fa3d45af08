#include "hash/token_seq.hpp"

#include <algorithm>

namespace kvt {

TokenSeq::TokenSeq(uint64_t salt_hash, uint32_t page_size)
    : hasher_(salt_hash), page_size_(page_size) {
  partial_.reserve(page_size);
}

void TokenSeq::close_block(const uint32_t *tokens) {
  uint64_t b = hasher_.block(tokens, page_size_);
  uint64_t s = seq_hashes_.empty() ? b : hasher_.chain(seq_hashes_.back(), b);
  block_hashes_.push_back(b);
  seq_hashes_.push_back(s);
}

void TokenSeq::append(const uint32_t *tokens, size_t n) {
  // Reserve first so that a failed allocation leaves the sequence unchanged.
  size_t new_blocks = (partial_.size() + n) / page_size_;
  block_hashes_.reserve(block_hashes_.size() + new_blocks);
  seq_hashes_.reserve(seq_hashes_.size() + new_blocks);
  total_ += n;
  if (!partial_.empty()) {
    size_t take = std::min<size_t>(n, page_size_ - partial_.size());
    partial_.insert(partial_.end(), tokens, tokens + take);
    tokens += take;
    n -= take;
    if (partial_.size() < page_size_) return;
    close_block(partial_.data());
    partial_.clear();
  }
  // Whole blocks straight from the caller's buffer, without copying.
  for (; n >= page_size_; n -= page_size_, tokens += page_size_) close_block(tokens);
  partial_.assign(tokens, tokens + n);
}

}  // namespace kvt
