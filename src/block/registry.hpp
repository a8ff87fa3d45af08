// A tier's registry: sequence hash -> slot. It stores only 4-byte slot indices and finds
// each index's hash in the slot array, so a registered block costs about 5 bytes here
// instead of 16 for a (hash, slot) pair; lookups read the slot they will pin anyway.
#pragma once

#include <absl/container/flat_hash_set.h>
#include <absl/hash/hash.h>

#include <cstdint>

#include "memory/mapping.hpp"

namespace kvt {

template <class SlotT>
class Registry {
 public:
  explicit Registry(const SlotT *const *slots)
      : set_(0, Hash{slots}, Eq{slots}) {}

  void reserve(size_t n) { set_.reserve(n); }
  // The slot registered under hash, or UINT32_MAX.
  uint32_t find(uint64_t hash) const {
    auto it = set_.find(Key{hash});
    return it == set_.end() ? UINT32_MAX : *it;
  }
  // Starts loading the part of the table where hash would be, for a lookup soon after.
  void prefetch(uint64_t hash) const { set_.prefetch(Key{hash}); }
  // Registers slot s under (*slots)[s].seq_hash, in one probe. Returns the slot already
  // registered under that hash (and registers nothing), or s.
  uint32_t insert(uint32_t s) { return *set_.insert(s).first; }
  void erase(uint64_t hash) { set_.erase(Key{hash}); }
  size_t size() const { return set_.size(); }
  size_t bytes() const { return set_.capacity() * (sizeof(uint32_t) + 1); }

 private:
  struct Key {
    uint64_t hash;
  };
  struct Hash {
    using is_transparent = void;
    const SlotT *const *slots;
    size_t operator()(uint32_t s) const { return absl::Hash<uint64_t>{}((*slots)[s].seq_hash); }
    size_t operator()(Key k) const { return absl::Hash<uint64_t>{}(k.hash); }
  };
  struct Eq {
    using is_transparent = void;
    const SlotT *const *slots;
    bool operator()(uint32_t a, uint32_t b) const {
      return (*slots)[a].seq_hash == (*slots)[b].seq_hash;
    }
    bool operator()(uint32_t a, Key k) const { return (*slots)[a].seq_hash == k.hash; }
    bool operator()(Key k, uint32_t a) const { return (*slots)[a].seq_hash == k.hash; }
  };
  absl::flat_hash_set<uint32_t, Hash, Eq, MappedAllocator<uint32_t>> set_;
};

}  // namespace kvt
