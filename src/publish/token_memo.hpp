// The tokens of recently registered blocks, by sequence hash, for BlockStored's token_ids.
// Bounded: at most `capacity` blocks (the tiers' total capacity), the least recently noted
// or read forgotten first. Thread-safe: tiers note under their locks, the publisher's
// thread reads.
#pragma once

#include <absl/container/flat_hash_map.h>

#include <cstdint>
#include <mutex>
#include <vector>

namespace kvt::pub {

class TokenMemo {
 public:
  TokenMemo(uint64_t capacity, uint32_t page_size);

  // page_size tokens of the block seq_hash; a hash noted again gets these tokens and
  // becomes the most recent. Never throws: out of memory, the block is not remembered.
  void note(uint64_t seq_hash, const uint32_t *tokens) noexcept;
  // Appends the block's tokens to *out and makes it the most recent; false when unknown
  // (then *out is unchanged).
  bool read(uint64_t seq_hash, std::vector<uint32_t> *out);
  size_t size();

 private:
  static constexpr uint32_t kNil = UINT32_MAX;
  struct Node {
    uint64_t hash;
    uint32_t prev, next;  // recency list, most recent at head_
  };
  void unlink(uint32_t i) noexcept;
  void push_front(uint32_t i) noexcept;

  const uint64_t capacity_;
  const uint32_t page_size_;
  std::mutex mu_;
  absl::flat_hash_map<uint64_t, uint32_t> index_;  // hash -> node
  std::vector<Node> nodes_;                        // grown up to capacity_, then reused
  std::vector<uint32_t> tokens_;                   // page_size_ per node
  uint32_t head_ = kNil, tail_ = kNil;
};

}  // namespace kvt::pub
