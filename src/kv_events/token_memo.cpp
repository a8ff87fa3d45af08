#include "kv_events/token_memo.hpp"

#include <algorithm>
#include <cstring>

namespace kvt::pub {

TokenMemo::TokenMemo(uint64_t capacity, uint32_t page_size)
    : capacity_(std::max<uint64_t>(capacity, 1)), page_size_(page_size) {
  // Address space for the tiers' capacity, touched only as blocks are noted: growing by
  // doubling copied the memo (2 KiB a block at 512 tokens) again and again as it filled.
  try {
    nodes_.reserve(capacity_);
    tokens_.reserve(capacity_ * page_size_);
  } catch (...) {  // more than the address space allows: grown as needed instead
  }
}

void TokenMemo::unlink(uint32_t i) noexcept {
  Node &n = nodes_[i];
  (n.prev == kNil ? head_ : nodes_[n.prev].next) = n.next;
  (n.next == kNil ? tail_ : nodes_[n.next].prev) = n.prev;
  n.linked = false;
}

void TokenMemo::push_front(uint32_t i) noexcept {
  nodes_[i].prev = kNil;
  nodes_[i].next = head_;
  (head_ == kNil ? tail_ : nodes_[head_].prev) = i;
  head_ = i;
  nodes_[i].linked = true;
}

void TokenMemo::push_back(uint32_t i) noexcept {
  nodes_[i].prev = tail_;
  nodes_[i].next = kNil;
  (tail_ == kNil ? head_ : nodes_[tail_].next) = i;
  tail_ = i;
  nodes_[i].linked = true;
}

void TokenMemo::unhold(uint32_t i) noexcept {
  ++unheld_;
  if (!nodes_[i].linked) push_back(i);  // it left the list from its tail: older than all
  forget();
}

void TokenMemo::forget() noexcept {
  while (unheld_ > capacity_) {
    const uint32_t t = tail_;
    unlink(t);
    if (held(nodes_[t])) continue;
    index_.erase(nodes_[t].hash);
    nodes_[t].next = free_;
    free_ = t;
    --unheld_;
  }
}

void TokenMemo::note(uint64_t seq_hash, const uint32_t *tokens) noexcept {
  std::lock_guard lock(mu_);
  uint32_t i;
  if (auto it = index_.find(seq_hash); it != index_.end()) {
    i = it->second;  // its tokens are these: not copied again
    if (nodes_[i].linked) unlink(i);
  } else {
    try {
      // Each step that may throw leaves the memo as it was (with a spare node, maybe).
      if (free_ == kNil) {
        const uint32_t spare = uint32_t(nodes_.size());
        tokens_.resize(size_t(spare + 1) * page_size_);
        nodes_.push_back(Node{0, kNil, kNil, 0, 0, false});
        free_ = spare;
      }
      i = free_;
      index_.emplace(seq_hash, i);
    } catch (...) {  // out of memory: not remembered
      return;
    }
    free_ = nodes_[i].next;
    nodes_[i] = Node{seq_hash, kNil, kNil, 0, 0, false};
    ++unheld_;
    std::memcpy(tokens_.data() + size_t(i) * page_size_, tokens, page_size_ * sizeof(uint32_t));
  }
  push_front(i);
  forget();
}

bool TokenMemo::stored(uint64_t seq_hash, unsigned tier, bool queue) noexcept {
  std::lock_guard lock(mu_);
  auto it = index_.find(seq_hash);
  if (it == index_.end()) return false;
  Node &n = nodes_[it->second];
  if (!held(n)) --unheld_;  // it keeps its place on the list
  n.tiers |= uint8_t(1u << tier);
  n.queued += queue;
  return true;
}

void TokenMemo::removed(uint64_t seq_hash, unsigned tier) noexcept {
  std::lock_guard lock(mu_);
  auto it = index_.find(seq_hash);
  if (it == index_.end()) return;
  Node &n = nodes_[it->second];
  // A block a tier recovered (a persistent G3) was never stored here: nothing to drop.
  if (!(n.tiers & (1u << tier))) return;
  n.tiers &= uint8_t(~(1u << tier));
  if (!held(n)) unhold(it->second);
}

bool TokenMemo::take(uint64_t seq_hash, bool queued, std::vector<uint32_t> *out) {
  std::lock_guard lock(mu_);
  auto it = index_.find(seq_hash);
  if (it == index_.end()) return false;
  const uint32_t i = it->second;
  // After the copy, as unhold may forget i; even when *out cannot grow.
  auto release = [&]() noexcept {
    if (queued && --nodes_[i].queued == 0 && !held(nodes_[i])) unhold(i);
  };
  if (out) {
    const uint32_t *t = tokens_.data() + size_t(i) * page_size_;
    try {
      out->insert(out->end(), t, t + page_size_);
    } catch (...) {
      release();
      throw;
    }
  }
  release();
  return true;
}

size_t TokenMemo::size() {
  std::lock_guard lock(mu_);
  return index_.size();
}

}  // namespace kvt::pub
