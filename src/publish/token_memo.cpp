#include "publish/token_memo.hpp"

#include <algorithm>
#include <cstring>

namespace kvt::pub {

TokenMemo::TokenMemo(uint64_t capacity, uint32_t page_size)
    : capacity_(std::max<uint64_t>(capacity, 1)), page_size_(page_size) {}

void TokenMemo::unlink(uint32_t i) noexcept {
  Node &n = nodes_[i];
  (n.prev == kNil ? head_ : nodes_[n.prev].next) = n.next;
  (n.next == kNil ? tail_ : nodes_[n.next].prev) = n.prev;
}

void TokenMemo::push_front(uint32_t i) noexcept {
  nodes_[i].prev = kNil;
  nodes_[i].next = head_;
  (head_ == kNil ? tail_ : nodes_[head_].prev) = i;
  head_ = i;
}

void TokenMemo::note(uint64_t seq_hash, const uint32_t *tokens) noexcept {
  std::lock_guard lock(mu_);
  try {
    uint32_t i;
    if (auto it = index_.find(seq_hash); it != index_.end()) {
      i = it->second;
      unlink(i);
    } else if (nodes_.size() < capacity_) {
      // Each step that may throw leaves the memo as it was (tokens_ may be larger).
      i = uint32_t(nodes_.size());
      tokens_.resize(size_t(i + 1) * page_size_);
      nodes_.push_back(Node{seq_hash, kNil, kNil});
      try {
        index_.emplace(seq_hash, i);
      } catch (...) {
        nodes_.pop_back();
        throw;
      }
    } else {
      i = tail_;  // forget the least recent
      index_.emplace(seq_hash, i);  // may throw: nothing changed yet
      index_.erase(nodes_[i].hash);
      unlink(i);
      nodes_[i].hash = seq_hash;
    }
    std::memcpy(tokens_.data() + size_t(i) * page_size_, tokens, page_size_ * sizeof(uint32_t));
    push_front(i);
  } catch (...) {
  }
}

bool TokenMemo::read(uint64_t seq_hash, std::vector<uint32_t> *out) {
  std::lock_guard lock(mu_);
  auto it = index_.find(seq_hash);
  if (it == index_.end()) return false;
  uint32_t i = it->second;
  const uint32_t *t = tokens_.data() + size_t(i) * page_size_;
  out->insert(out->end(), t, t + page_size_);
  unlink(i);
  push_front(i);
  return true;
}

size_t TokenMemo::size() {
  std::lock_guard lock(mu_);
  return index_.size();
}

}  // namespace kvt::pub
