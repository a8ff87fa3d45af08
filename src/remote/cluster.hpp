// A Redis Cluster as G4 sees it: its masters, each a Shard, and a route from each of the
// 16384 slots to the master that serves it, read with CLUSTER SLOTS from the seeds or any
// known master. Callers route a batch by the route they hold (a snapshot: a refresh never
// blocks them) and ask for a refresh when a MOVED or a failed node says it is out of date.
// Masters are added as maps and redirections name them, at most kMaxNodes, and never
// removed: one that left is simply routed to no more.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kvtier.h"
#include "remote/endpoint.hpp"
#include "remote/shard.hpp"
#include "remote/slot_map.hpp"

namespace kvt::remote {

class Cluster {
 public:
  using Route = std::array<uint16_t, kSlots>;  // a node's index per slot, or kNoNode

  Cluster(std::vector<Endpoint> seeds, const std::string &password, uint64_t timeout_us,
          std::atomic<uint64_t> &reconnects);

  // The current route; the first call reads the map. KVT_ERR_IO when no node answers.
  kvt_status route(std::shared_ptr<const Route> *out);
  // Reads the map again, unless another caller installed a route since `seen` was current
  // or is reading one now (nobody waits on another's network reads). After a MOVED (`now`),
  // at once; after a failure, at most once per kFailureRefreshGap, for a failover takes the
  // cluster seconds. A map that cannot be read leaves the route as it was.
  void refresh(const Route *seen, bool now);
  // The node at e, added when new; kNoNode when kMaxNodes are known already.
  uint16_t node_at(const Endpoint &e);
  Shard &node(uint16_t i) { return *nodes_[i]; }
  // Masters in the current route, and maps read so far.
  uint32_t masters() const;
  uint64_t refreshes() const { return refreshes_.load(std::memory_order_relaxed); }

 private:
  static constexpr std::chrono::milliseconds kFailureRefreshGap{100};

  void refresh_locked(const Route *seen, bool now);
  kvt_status read_map(SlotMap *out);
  kvt_status read_from(uint16_t node, SlotMap *out);
  uint16_t add_locked(const Endpoint &e);

  const std::vector<Endpoint> seeds_;
  const std::string &password_;
  const uint64_t timeout_us_;
  std::atomic<uint64_t> &reconnects_;
  std::atomic<uint64_t> refreshes_{0};

  std::mutex refresh_mu_;  // one refresh at a time; taken before mu_, waited for only by
                           // the first route()
  std::chrono::steady_clock::time_point last_refresh_{};  // guarded by refresh_mu_
  mutable std::mutex mu_;
  std::shared_ptr<const Route> route_;  // guarded by mu_
  uint32_t masters_ = 0;                // guarded by mu_
  // Fixed room, so that a Shard never moves while another thread uses it; the count is
  // guarded by mu_, and a caller only holds indices that a route or node_at gave it.
  std::unique_ptr<std::unique_ptr<Shard>[]> nodes_;
  size_t count_ = 0;
};

}  // namespace kvt::remote
