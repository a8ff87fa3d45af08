#include "connector/connector.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "common/error.hpp"
#include "hash/chain_hash.hpp"
#include "manager/manager.hpp"

namespace kvt::conn {

void Connector::defaults(kvt_connector_config *c) noexcept {
  std::memset(c, 0, sizeof *c);
  c->struct_size = sizeof *c;
  c->role = KVT_ROLE_BOTH;
  c->offload = KVT_OFFLOAD_EAGER;
  c->store_tier = KVT_TIER_G2;
  c->salt_hash = hash_salt(nullptr, 0);
  c->pause_timeout_ms = 30000;
  c->world_size = 1;
}

kvt_status Connector::validate(kvt_connector_config *c, const Manager &m, const char *fn) {
  auto bad = [&](const char *field, uint64_t v, const char *want) {
    return fail(KVT_ERR_INVALID_ARGUMENT, "%s: cfg->%s is %llu, but must be %s", fn, field,
                (unsigned long long)v, want);
  };
  if (c->role < KVT_ROLE_SCHEDULER || c->role > KVT_ROLE_BOTH)
    return bad("role", c->role, "KVT_ROLE_SCHEDULER (1), KVT_ROLE_WORKER (2) or KVT_ROLE_BOTH (3)");
  if (c->offload > KVT_OFFLOAD_LAZY)
    return bad("offload", c->offload, "KVT_OFFLOAD_EAGER (0) or KVT_OFFLOAD_LAZY (1)");
  if (c->store_tier != KVT_TIER_G2 && c->store_tier != KVT_TIER_G3)
    return bad("store_tier", c->store_tier, "KVT_TIER_G2 (2) or KVT_TIER_G3 (3)");
  if (c->load_async > 1) return bad("load_async", c->load_async, "0 or 1");
  if (c->reserved != 0) return bad("reserved", c->reserved, "0");
  if (c->reserved2 != 0) return bad("reserved2", c->reserved2, "0");
  if (c->reserved3 != 0) return bad("reserved3", c->reserved3, "0");
  if (c->sliding_window != 0 && c->offload == KVT_OFFLOAD_LAZY)
    return fail(KVT_ERR_INVALID_ARGUMENT,
                "%s: cfg->sliding_window is %u with lazy offload: the engine reuses the blocks "
                "that leave the window unseen, so they cannot be stored lazily", fn,
                c->sliding_window);
  if (c->pause_timeout_ms < 1 || c->pause_timeout_ms > kMaxPauseMs)
    return bad("pause_timeout_ms", c->pause_timeout_ms, "1 .. 3600000 (1 ms .. 1 hour)");
  if (c->world_size < 1 || c->world_size > KVT_MAX_WORLD_SIZE)
    return bad("world_size", c->world_size, "1 .. KVT_MAX_WORLD_SIZE (4096)");
  if (c->rank >= c->world_size)
    return bad("rank", c->rank, "below world_size");
  if (c->role == KVT_ROLE_BOTH && c->world_size != 1)
    return bad("world_size", c->world_size, "1 for a connector of both halves (KVT_ROLE_BOTH)");
  if (c->endpoint_path != nullptr && c->endpoint_path[0] == '\0')
    return fail(KVT_ERR_INVALID_ARGUMENT, "%s: cfg->endpoint_path is empty (NULL: no endpoint)",
                fn);
  if (c->num_gpu_blocks == 0) c->num_gpu_blocks = m.config().g1_blocks;
  if (c->num_gpu_blocks > KVT_MAX_TIER_BLOCKS)
    return bad("num_gpu_blocks", c->num_gpu_blocks, "at most KVT_MAX_TIER_BLOCKS");
  uint64_t cap = c->store_tier == KVT_TIER_G2 ? m.config().g2_blocks : m.config().g3_blocks;
  if ((c->role & KVT_ROLE_SCHEDULER) && cap == 0)
    return fail(KVT_ERR_INVALID_ARGUMENT,
                "%s: cfg->store_tier is G%u, which the manager lacks (its capacity is 0)", fn,
                c->store_tier);
  return KVT_OK;
}

kvt_status Connector::create(std::unique_ptr<Connector> *out, Manager &m,
                             const kvt_connector_config &c, const char *fn) {
  if (!m.take_connector())
    return fail(KVT_ERR_STATE, "%s: the manager serves another connector already", fn);
  std::unique_ptr<Connector> conn;
  try {
    conn.reset(new Connector(m));  // from here on, its destructor gives the manager back
  } catch (...) {
    m.give_connector();
    throw;
  }
  if (c.role & KVT_ROLE_SCHEDULER) conn->sched_ = std::make_unique<Scheduler>(m, c);
  if (c.role & KVT_ROLE_WORKER)
    conn->worker_ = std::make_unique<Worker>(m, c.world_size, c.rank, c.sliding_window != 0);
  *out = std::move(conn);
  return KVT_OK;
}

Connector::~Connector() {
  if (sched_) {
    sched_->breakpoints().release();
    std::lock_guard lock(mu_);
  }
  worker_.reset();
  sched_.reset();
  mgr_.give_connector();
}

kvt_status Connector::no_scheduler(const char *fn) {
  return fail(KVT_ERR_STATE, "%s: this connector has no scheduler half (its role is WORKER)", fn);
}

kvt_status Connector::no_worker(const char *fn) {
  return fail(KVT_ERR_STATE, "%s: this connector has no worker half (its role is SCHEDULER)", fn);
}

Snapshot Connector::inspect() {
  Snapshot s;
  for (;;) {
    if (sched_->breakpoints().paused_snapshot(&s)) return s;
    if (mu_.try_lock()) {
      std::lock_guard lock(mu_, std::adopt_lock);
      return sched_->snapshot();
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

bool Connector::slot_counts(uint64_t slots[kSlotStates], kvt_connector_stats *st) {
  if (!sched_) return false;
  Snapshot s = inspect();
  std::fill(slots, slots + kSlotStates, 0);
  for (const kvt_slot_info &i : s.slots) ++slots[i.state];
  *st = s.stats;
  return true;
}

}  // namespace kvt::conn
