#include "remote/cluster.hpp"

#include <string>

#include "common/error.hpp"
#include "common/log.hpp"
#include "remote/connection.hpp"

namespace kvt::remote {

Cluster::Cluster(std::vector<Endpoint> seeds, const std::string &password, uint64_t timeout_us,
                 std::atomic<uint64_t> &reconnects)
    : seeds_(std::move(seeds)),
      password_(password),
      timeout_us_(timeout_us),
      reconnects_(reconnects),
      nodes_(new std::unique_ptr<Shard>[kMaxNodes]) {}

uint16_t Cluster::add_locked(const Endpoint &e) {
  const std::string name = e.name();
  for (size_t i = 0; i < count_; ++i)
    if (nodes_[i]->endpoint().name() == name) return uint16_t(i);
  if (count_ == kMaxNodes) return kNoNode;
  nodes_[count_] = std::make_unique<Shard>(e, password_, timeout_us_, reconnects_);
  return uint16_t(count_++);
}

uint16_t Cluster::node_at(const Endpoint &e) {
  std::lock_guard lock(mu_);
  return add_locked(e);
}

uint32_t Cluster::masters() const {
  std::lock_guard lock(mu_);
  return masters_;
}

kvt_status Cluster::route(std::shared_ptr<const Route> *out) {
  {
    std::lock_guard lock(mu_);
    if (route_) {
      *out = route_;
      return KVT_OK;
    }
  }
  {
    std::lock_guard once(refresh_mu_);  // a first read in flight: its map serves this call
    refresh_locked(nullptr, true);
  }
  std::lock_guard lock(mu_);
  if (!route_) return KVT_ERR_IO;  // read_map's message
  *out = route_;
  return KVT_OK;
}

kvt_status Cluster::read_from(uint16_t node, SlotMap *out) {
  Shard &s = *nodes_[node];
  std::unique_ptr<Connection> c;
  kvt_status st = s.acquire(&c);
  if (st != KVT_OK) return st;
  Request r;
  r.add({"CLUSTER", "SLOTS"});
  st = c->send(r);
  if (st == KVT_OK)
    st = c->read_with([&](ReplyReader &rd) { return read_slot_map(out, rd, s.endpoint()); });
  s.release(std::move(c), st == KVT_OK);
  return st;
}

kvt_status Cluster::read_map(SlotMap *out) {
  // The masters of the route in hand first (they know the cluster now), then the seeds.
  std::vector<uint16_t> ask;
  {
    std::lock_guard lock(mu_);
    for (size_t i = 0; i < count_; ++i) ask.push_back(uint16_t(i));
    for (const Endpoint &e : seeds_)
      if (uint16_t n = add_locked(e); n != kNoNode) ask.push_back(n);
  }
  std::string why;
  for (uint16_t n : ask) {
    if (read_from(n, out) == KVT_OK) return KVT_OK;
    why += why.empty() ? "" : "; ";
    why += last_error();
  }
  return fail(KVT_ERR_IO, "G4: no node of the cluster gave its slot map: %s", why.c_str());
}

void Cluster::refresh(const Route *seen, bool now) {
  std::unique_lock once(refresh_mu_, std::try_to_lock);
  if (once.owns_lock()) refresh_locked(seen, now);
}

void Cluster::refresh_locked(const Route *seen, bool now) {
  {
    std::lock_guard lock(mu_);
    if (route_ && route_.get() != seen) return;  // another caller refreshed meanwhile
  }
  const auto t = std::chrono::steady_clock::now();
  if (!now && t - last_refresh_ < kFailureRefreshGap) return;
  last_refresh_ = t;
  SlotMap map;
  if (read_map(&map) != KVT_OK) {
    log(KVT_LOG_WARN, "%s", last_error());
    return;
  }
  refreshes_.fetch_add(1, std::memory_order_relaxed);
  auto route = std::make_shared<Route>();
  std::lock_guard lock(mu_);
  std::vector<uint16_t> index(map.nodes.size());
  for (size_t i = 0; i < map.nodes.size(); ++i) index[i] = add_locked(map.nodes[i]);
  for (size_t slot = 0; slot < kSlots; ++slot)
    (*route)[slot] = map.owner[slot] == kNoNode ? kNoNode : index[map.owner[slot]];
  masters_ = uint32_t(map.nodes.size());
  route_ = std::move(route);
}

}  // namespace kvt::remote
