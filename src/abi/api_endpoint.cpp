// kvt_endpoint: the management endpoint (src/observe/endpoint.cpp), answering with
// src/manage/endpoint_ops.cpp for a manager and its connector.
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>

#include "abi/connector_object.hpp"
#include "abi/guard.hpp"
#include "common/versioned.hpp"
#include "manage/endpoint_ops.hpp"
#include "observe/endpoint.hpp"

struct kvt_endpoint {
  static constexpr uint64_t kMagic = 0x6b7674656e647074;  // "kvtendpt"
  uint64_t magic = kMagic;
  kvt::obs::Endpoint impl;
};

using namespace kvt;
using namespace kvt::abi;

extern "C" {

KVT_API void kvt_endpoint_config_init_sized(kvt_endpoint_config *cfg, size_t size) {
  if (cfg == nullptr) return;
  if (check_struct_size<kvt_endpoint_config>("kvt_endpoint_config_init_sized", "cfg", size) !=
      KVT_OK) {
    if (size >= sizeof cfg->struct_size)
      cfg->struct_size = uint32_t(std::min<size_t>(size, UINT32_MAX));
    return;
  }
  kvt_endpoint_config full = manage::endpoint_defaults();
  full.struct_size = uint32_t(size);
  std::memcpy(static_cast<void *>(cfg), &full, size);
}

KVT_API kvt_status kvt_endpoint_open_with(kvt_endpoint **out, kvt_manager *m, kvt_connector *c,
                                          const char *path, const kvt_endpoint_config *cfg) {
  static constexpr const char *fn = "kvt_endpoint_open";
  if (out == nullptr) return null_arg(fn, "out");
  if (path == nullptr) return null_arg(fn, "path");
  kvt_endpoint_config full = manage::endpoint_defaults();
  if (cfg != nullptr) {
    if (kvt_status st = read_versioned(&full, *cfg, fn, "cfg"); st != KVT_OK) return st;
    if (kvt_status st = manage::validate_endpoint(full, fn); st != KVT_OK) return st;
  }
  return on_manager(fn, m, [&](Manager &mgr) {
    conn::Connector *conn = nullptr;
    if (c != nullptr) {
      kvt_status st;
      if ((conn = connector(fn, c, &st)) == nullptr) return st;
      if (&conn->manager() != &mgr)
        return fail(KVT_ERR_INVALID_ARGUMENT, "%s: the connector belongs to another manager", fn);
    }
    if (kvt_status st = endpoint_open(out, mgr, conn, path, &full); st != KVT_OK)
      return fail(st, "%s: %s", fn, std::string(kvt_last_error()).c_str());
    return KVT_OK;
  });
}

KVT_API kvt_status kvt_endpoint_open(kvt_endpoint **out, kvt_manager *m, kvt_connector *c,
                                     const char *path) {
  return kvt_endpoint_open_with(out, m, c, path, nullptr);
}

KVT_API void kvt_endpoint_close(kvt_endpoint *e) { endpoint_close(e); }

KVT_API kvt_status kvt_endpoint_stats_get(kvt_endpoint_stats *out, kvt_endpoint *e) {
  static constexpr const char *fn = "kvt_endpoint_stats_get";
  if (out == nullptr) return null_arg(fn, "out");
  if (e == nullptr || e->magic != kvt_endpoint::kMagic)
    return fail(KVT_ERR_INVALID_HANDLE, "%s: not an open endpoint", fn);
  if (kvt_status st = check_struct_size<kvt_endpoint_stats>(fn, "out", out->struct_size);
      st != KVT_OK)
    return st;
  const obs::EndpointStats s = e->impl.stats();
  kvt_endpoint_stats r{};
  r.clients = s.clients;
  r.refused = s.refused;
  r.dropped = s.dropped;
  r.peak_buffered_bytes = s.peak_buffered;
  write_versioned(out, r);
  return KVT_OK;
}

}  // extern "C"

namespace kvt::abi {

kvt_status endpoint_open(kvt_endpoint **out, Manager &mgr, conn::Connector *c,
                         const char *path, const kvt_endpoint_config *cfg) {
  const kvt_endpoint_config full = cfg != nullptr ? *cfg : manage::endpoint_defaults();
  auto e = std::make_unique<kvt_endpoint>();
  if (kvt_status st = e->impl.open(path, mgr.bus_ptr(), manage::endpoint_ops(mgr, c),
                                   manage::endpoint_limits(full));
      st != KVT_OK)
    return st;
  *out = e.release();
  return KVT_OK;
}

void endpoint_close(kvt_endpoint *e) noexcept {
  if (e == nullptr || e->magic != kvt_endpoint::kMagic) return;
  e->magic = 0;
  delete e;
}

}  // namespace kvt::abi
