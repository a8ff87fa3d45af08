// A tier's registry: sequence hash -> slot. Each entry is a 4-byte slot index and a 4-byte
// tag of its hash; the full hash lives in the slot array. So a registered block costs about
// 9 bytes here instead of 17 for a (hash, slot) pair, and a lookup can find its candidate
// slot from the table alone, without first reading the slot (see Tier::match).
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
    return it == set_.end() ? UINT32_MAX : it->slot;
  }
  // The first slot whose tag matches hash's, reading the table only. UINT32_MAX proves that
  // nothing is registered under hash; any other slot is only likely to be the one (a wrong
  // one 2^-32 of the time at most): the caller confirms its seq_hash, or else calls find().
  uint32_t candidate(uint64_t hash) const {
    auto it = set_.find(TagKey{hash});
    return it == set_.end() ? UINT32_MAX : it->slot;
  }
  // Starts loading the part of the table where hash would be, for a lookup soon after.
  void prefetch(uint64_t hash) const { set_.prefetch(Key{hash}); }
  // Registers slot s under (*slots)[s].seq_hash, in one probe. Returns the slot already
  // registered under that hash (and registers nothing), or s.
  uint32_t insert(uint32_t s) {
    const SlotT *slots = *set_.hash_function().slots;
    return set_.insert(Entry{s, tag(slots[s].seq_hash)}).first->slot;
  }
  void erase(uint64_t hash) { set_.erase(Key{hash}); }
  size_t size() const { return set_.size(); }
  size_t bytes() const { return set_.capacity() * (sizeof(Entry) + 1); }

 private:
  struct Entry {
    uint32_t slot;
    uint32_t tag;
  };
  struct Key {
    uint64_t hash;
  };
  struct TagKey {
    uint64_t hash;
  };
  // Independent of the bits absl uses to place an entry, so that entries probed together
  // rarely share a tag, and spread even for small, sequential hashes.
  static uint32_t tag(uint64_t hash) { return uint32_t((hash * 0x9E3779B97F4A7C15ull) >> 32); }
  struct Hash {
    using is_transparent = void;
    const SlotT *const *slots;
    size_t operator()(Entry e) const { return absl::Hash<uint64_t>{}((*slots)[e.slot].seq_hash); }
    size_t operator()(Key k) const { return absl::Hash<uint64_t>{}(k.hash); }
    size_t operator()(TagKey k) const { return absl::Hash<uint64_t>{}(k.hash); }
  };
  struct Eq {
    using is_transparent = void;
    const SlotT *const *slots;
    bool operator()(Entry a, Entry b) const {
      return a.tag == b.tag && (*slots)[a.slot].seq_hash == (*slots)[b.slot].seq_hash;
    }
    bool operator()(Entry a, Key k) const {
      return a.tag == tag(k.hash) && (*slots)[a.slot].seq_hash == k.hash;
    }
    bool operator()(Key k, Entry a) const { return (*this)(a, k); }
    bool operator()(Entry a, TagKey k) const { return a.tag == tag(k.hash); }
    bool operator()(TagKey k, Entry a) const { return a.tag == tag(k.hash); }
  };
  absl::flat_hash_set<Entry, Hash, Eq, MappedAllocator<Entry>> set_;
};

}  // namespace kvt
