// The struct behind kvt_connector, for the ABI files that reach into it (the connector's
// calls, metrics, the management endpoint, the event log's rerun).
#pragma once

#include <memory>

#include "abi/objects.hpp"
#include "connector/connector.hpp"

struct kvt_connector {
  static constexpr uint64_t kMagic = 0x6b7674636f6e6e65;  // "kvtconne"
  uint64_t magic = kMagic;
  kvt_manager *manager;
  std::unique_ptr<kvt::conn::Connector> impl;
  kvt_endpoint *endpoint = nullptr;  // the config's endpoint_path, while the connector lives
};

namespace kvt::abi {

inline kvt::conn::Connector *connector(const char *fn, kvt_connector *c,
                                       kvt_status *st) noexcept {
  if (c == nullptr || c->magic != kvt_connector::kMagic) {
    *st = bad_object(fn, c, "connector");
    return nullptr;
  }
  *st = KVT_OK;
  return c->impl.get();
}

// kvt_endpoint_open and _close, for the connector's own endpoint (config.endpoint_path).
// cfg NULL: kvt_endpoint_config's defaults.
kvt_status endpoint_open(kvt_endpoint **out, Manager &mgr, conn::Connector *c,
                         const char *path, const kvt_endpoint_config *cfg = nullptr);
void endpoint_close(kvt_endpoint *e) noexcept;

}  // namespace kvt::abi
