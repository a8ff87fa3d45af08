// What a KV-aware router knows of a fleet: per instance, the block hashes it holds and in
// which media, kept from its BlockStored / BlockRemoved / AllBlocksCleared events.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <absl/container/flat_hash_map.h>

#include "event_decoder.hpp"

namespace kvt::router {

class Index {
 public:
  static constexpr size_t kMaxMedia = 32;  // a 33rd name shares the last one's bit

  // Instances are numbered from 0 in the order they are added.
  size_t add_instance();
  size_t instances() const { return inst_.size(); }

  void apply(size_t inst, const Batch &b);
  void clear(size_t inst) { inst_[inst].clear(); }

  // The number of leading hashes of h[0..n) that instance `inst` holds in any medium, or,
  // with `medium`, in that one (a medium never seen: 0).
  size_t prefix(size_t inst, const uint64_t *h, size_t n,
                const std::optional<std::string> &medium = std::nullopt) const;

  // Blocks the instance holds in any medium, or in `medium`.
  size_t blocks(size_t inst, const std::optional<std::string> &medium = std::nullopt) const;
  // Its hashes in `medium`, or in any medium, sorted.
  std::vector<uint64_t> hashes(size_t inst,
                               const std::optional<std::string> &medium = std::nullopt) const;

  // Medium names in the order they were first seen; "" stands for a medium of None.
  const std::vector<std::string> &media() const { return names_; }

 private:
  using Masks = absl::flat_hash_map<uint64_t, uint32_t>;  // hash -> bit per medium
  uint32_t bit_of(const std::optional<std::string> &medium);
  std::optional<uint32_t> find_bit(const std::optional<std::string> &medium) const;

  std::vector<Masks> inst_;
  std::vector<std::string> names_;
};

}  // namespace kvt::router
