// G4's client: blocks as Redis values on one or more shards, or on a Redis Cluster's
// masters, by sequence hash. Values carry a header that is checked on every read; commands
// are pipelined, one round trip per batch per node. The manager owns one Store; any thread
// may call it (each call borrows a pooled connection per node). Formats, shards, clusters,
// timeouts: docs/G4.md.
// A failing call leaves its message in the calling thread's kvt_last_error(); a Redis error
// reply (OOM under noeviction, NOAUTH, CLUSTERDOWN...) counts as KVT_ERR_IO with Redis's
// words; a cluster's MOVED and ASK are followed.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/keyed_mac.hpp"
#include "kvtier.h"

namespace kvt::remote {

struct Config {
  // One per shard: redis://host:port[/db], unix:///path[?db=N]; for a cluster, its seeds
  // as redis://host:port.
  std::vector<std::string> urls;
  bool cluster = false;           // g4_url is redis+cluster://: keys go by the cluster's slots
  std::string password;           // empty: no AUTH
  std::string key_prefix;         // "kvtier" by default
  uint64_t ns = 0;                // kvt_manager_config.g4_namespace
  uint64_t layout = 0;            // the block geometry's id: other layouts never match
  uint64_t timeout_us = 1000000;
  // g4_key_env's key: every value is written and checked with its MAC (remote/value_codec).
  std::optional<MacKey> value_key;
};

// Reads the g4_* fields of c (g4_url set) into *out; layout is the caller's. A bad URL or
// a shard listed twice, a cluster seed with a database or a Unix socket, an unset or empty
// password variable, a key variable unset or not 64 hex digits, a key prefix that is empty,
// longer than 128 bytes, not printable ASCII without spaces, or with braces on a cluster, a
// timeout of 0 or over an hour: KVT_ERR_INVALID_ARGUMENT naming the field.
kvt_status parse_config(Config *out, const kvt_manager_config &c, uint64_t layout);

// One block to write: its bytes (block_bytes of them, contiguous) and its chain.
struct Put {
  uint64_t hash, parent;
  const void *data;
  size_t len;
};

// One block to read into data (len bytes; they hold the block only when status is KVT_OK,
// for the value is read in place before it is checked); status is set: KVT_OK,
// KVT_ERR_NOT_FOUND, KVT_ERR_CORRUPT (the header, the length or the checksum is wrong, or the
// parent, namespace or layout is not the expected one; the key is deleted) or KVT_ERR_IO (its
// node is unreachable, timed out or answered with an error).
struct Get {
  uint64_t hash, parent;  // parent: the expected one
  void *data;
  size_t len;
  kvt_status status = KVT_OK;
};

class Store {
 public:
  // Connects to no shard yet: the first call does (and every call after a failure retries).
  static kvt_status create(std::unique_ptr<Store> *out, const Config &c);
  virtual ~Store() = default;

  // Length of the longest prefix of hashes[0..n) whose keys exist. KVT_ERR_IO (with
  // *out_n = 0) when a shard needed cannot be reached.
  virtual kvt_status exists_prefix(size_t *out_n, const uint64_t *hashes, size_t n) = 0;
  // Writes the blocks; status[i] is KVT_OK or KVT_ERR_IO.
  virtual void put(const Put *items, size_t n, kvt_status *status) = 0;
  // Reads the blocks, setting each one's status.
  virtual void get(Get *items, size_t n) = 0;
  // Fills the counters of kvt_g4_stats (struct_size untouched).
  virtual void stats(kvt_g4_stats *out) const = 0;
};

}  // namespace kvt::remote
