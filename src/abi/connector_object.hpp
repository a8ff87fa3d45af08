// The struct behind kvt_connector, for the ABI files that reach into it (the connector's
// calls, metrics, the management endpoint).
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "abi/objects.hpp"
#include "connector/scheduler.hpp"
#include "connector/worker.hpp"

struct kvt_connector {
  static constexpr uint64_t kMagic = 0x6b7674636f6e6e65;  // "kvtconne"
  uint64_t magic = kMagic;
  kvt_manager *manager;
  kvt::Manager *mgr;
  std::mutex mu;  // serializes the scheduler half
  std::unique_ptr<kvt::conn::Scheduler> sched;
  std::unique_ptr<kvt::conn::Worker> worker;
  std::string meta;  // the last build_connector_meta's bytes
  kvt_endpoint *endpoint = nullptr;  // the config's endpoint_path, while the connector lives
};

namespace kvt::abi {

inline kvt_connector *connector(const char *fn, kvt_connector *c, kvt_status *st) noexcept {
  if (c == nullptr || c->magic != kvt_connector::kMagic) {
    *st = bad_object(fn, c, "connector");
    return nullptr;
  }
  *st = KVT_OK;
  return c;
}

// kvt_endpoint_open and _close, for the connector's own endpoint (config.endpoint_path).
// cfg NULL: kvt_endpoint_config's defaults.
kvt_status endpoint_open(kvt_endpoint **out, kvt_manager *m, Manager &mgr, kvt_connector *c,
                         const char *path, const kvt_endpoint_config *cfg = nullptr);
void endpoint_close(kvt_endpoint *e) noexcept;

// What inspection shows: the state at the pause while the scheduler is paused (its thread
// holds c->mu), else the state now, under c->mu.
conn::Snapshot inspect(kvt_connector *c);

}  // namespace kvt::abi
