#include "remote/hash_ring.hpp"

#include <xxhash.h>

#include <algorithm>

namespace kvt::remote {

HashRing::HashRing(const std::vector<std::string> &shard_names) {
  points_.reserve(shard_names.size() * kVirtualNodes);
  for (size_t s = 0; s < shard_names.size(); ++s)
    for (int v = 0; v < kVirtualNodes; ++v) {
      std::string point = shard_names[s] + "#" + std::to_string(v);
      points_.emplace_back(XXH3_64bits(point.data(), point.size()), uint32_t(s));
    }
  std::sort(points_.begin(), points_.end());
}

size_t HashRing::shard_of(std::string_view key) const {
  if (points_.size() <= kVirtualNodes) return 0;  // one shard
  uint64_t h = XXH3_64bits(key.data(), key.size());
  auto it = std::lower_bound(points_.begin(), points_.end(), std::make_pair(h, uint32_t(0)));
  return it == points_.end() ? points_.front().second : it->second;
}

}  // namespace kvt::remote
