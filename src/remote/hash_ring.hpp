// Client-side consistent hashing: each shard owns kVirtualNodes points on a 64-bit ring,
// placed by the hash of its canonical name, and a key belongs to the first point at or after
// the key's hash. Adding or removing one of N shards moves about 1/N of the keys; every
// client that lists the same shards (in any order) places every key on the same shard.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kvt::remote {

class HashRing {
 public:
  static constexpr int kVirtualNodes = 160;

  explicit HashRing(const std::vector<std::string> &shard_names);
  // The shard (an index into shard_names) that holds key.
  size_t shard_of(std::string_view key) const;

 private:
  std::vector<std::pair<uint64_t, uint32_t>> points_;  // (position, shard), sorted
};

}  // namespace kvt::remote
