// The tokens of blocks by sequence hash, for BlockStored's token_ids. A block's tokens stay
// while a tier holds it (from its BLOCK_STORED to its BLOCK_REMOVED there, so that its
// offloads and onboards find them however long ago they were noted) and while a BlockStored
// of it waits for the publisher's thread. Of the others (noted but not yet stored, or no
// longer held) at most `capacity` are kept (the tiers' total capacity), the least recently
// noted forgotten first: a block a tier drops keeps the place its last note gave it, so
// that a request's evictions never push out the tokens it just noted. Thread-safe: tiers
// note and store under their locks, the publisher's thread takes.
#pragma once

#include <absl/container/flat_hash_map.h>

#include <cstdint>
#include <mutex>
#include <vector>

namespace kvt::pub {

class TokenMemo {
 public:
  TokenMemo(uint64_t capacity, uint32_t page_size);

  // page_size tokens of the block seq_hash; a hash noted again keeps the tokens it has (a
  // sequence hash names its tokens: they are equal) and becomes the most recently noted.
  // Never throws: out of memory, the block is not remembered.
  void note(uint64_t seq_hash, const uint32_t *tokens) noexcept;
  // Tier `tier` stored the block: its tokens stay until removed(seq_hash, tier). queue: a
  // BlockStored of it waits to be encoded, and its tokens stay for take() too. False when
  // its tokens are unknown (then nothing is kept).
  bool stored(uint64_t seq_hash, unsigned tier, bool queue) noexcept;
  void removed(uint64_t seq_hash, unsigned tier) noexcept;
  // Appends the block's tokens to *out (out may be null: only the hold is dropped), false
  // when unknown. queued: stored(.., queue) returned true for this BlockStored, whose hold
  // is dropped, also when *out cannot grow (the only throw).
  bool take(uint64_t seq_hash, bool queued, std::vector<uint32_t> *out);
  size_t size();

 private:
  static constexpr uint32_t kNil = UINT32_MAX;
  struct Node {
    uint64_t hash;
    uint32_t prev, next;  // the recency list (most recently noted at head_); the free list
    uint32_t queued;      // BlockStored events waiting for the publisher's thread
    uint8_t tiers;        // bit (1 << tier): that tier holds the block
    bool linked;          // on the recency list
  };
  static bool held(const Node &n) noexcept { return n.tiers != 0 || n.queued != 0; }
  void unlink(uint32_t i) noexcept;
  void push_front(uint32_t i) noexcept;
  void push_back(uint32_t i) noexcept;
  // Node i is held no more: it counts against capacity_ again.
  void unhold(uint32_t i) noexcept;
  // Forgets the least recently noted unheld nodes beyond capacity_. Held nodes met at the
  // tail leave the list (each once per hold), as they are older than every other.
  void forget() noexcept;

  const uint64_t capacity_;
  const uint32_t page_size_;
  std::mutex mu_;
  absl::flat_hash_map<uint64_t, uint32_t> index_;  // hash -> node
  std::vector<Node> nodes_;                        // grown as needed, forgotten ones reused
  std::vector<uint32_t> tokens_;                   // page_size_ per node
  uint32_t head_ = kNil, tail_ = kNil;             // the recency list
  uint64_t unheld_ = 0;                            // nodes not held (all on the list)
  uint32_t free_ = kNil;                           // forgotten nodes, linked by next
};

}  // namespace kvt::pub
