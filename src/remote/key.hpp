// G4's keys: "<prefix>:<namespace>:<layout>:<hash>", the three numbers as 16 lowercase hex
// digits, e.g. "kvtier:00000000000000a1:5f0c9e2b7d4a1e33:0123456789abcdef" (57 bytes with
// the default prefix). Readable in redis-cli, and SCAN MATCH "kvtier:<ns>:*" selects one
// namespace. Managers of another namespace or block layout build other keys, so they never
// see each other's values. On a Redis Cluster the hash is the key's hash tag,
// "...:{0123456789abcdef}", so that every key of one block (each tensor-parallel rank's,
// under its own namespace) lives in one slot, on one node.
#pragma once

#include <cstdint>
#include <string>

namespace kvt::remote {

struct KeySpace {
  std::string prefix;
  uint64_t ns = 0, layout = 0;
  bool tagged = false;  // the hash in braces

  std::string key(uint64_t hash) const;
};

}  // namespace kvt::remote
