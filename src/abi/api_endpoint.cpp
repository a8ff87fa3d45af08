// kvt_endpoint: the management endpoint (src/observe/endpoint.cpp) wired to a manager and
// its connector.
#include <algorithm>
#include <cctype>
#include <cstring>
#include <string>

#include "abi/connector_object.hpp"
#include "abi/guard.hpp"
#include "common/versioned.hpp"
#include "observe/endpoint.hpp"

struct kvt_endpoint {
  static constexpr uint64_t kMagic = 0x6b7674656e647074;  // "kvtendpt"
  uint64_t magic = kMagic;
  kvt::obs::Endpoint impl;
};

using namespace kvt;
using namespace kvt::abi;
using nlohmann::json;

namespace {

const char *short_state(uint32_t s) {
  const char *n = kvt_slot_state_str(s);
  return std::strncmp(n, "KVT_SLOT_", 9) == 0 ? n + 9 : n;
}

// "ONBOARDING", "onboarding", "KVT_SLOT_ONBOARDING" or 3: the state; 0 when none.
uint32_t parse_state(const json &v) {
  if (v.is_number_unsigned()) return v.get<uint32_t>() <= KVT_SLOT_FINISHED ? v.get<uint32_t>() : 0;
  if (!v.is_string()) return 0;
  std::string s = v.get<std::string>();
  for (char &ch : s) ch = char(std::toupper(static_cast<unsigned char>(ch)));
  for (uint32_t st = KVT_SLOT_INITIALIZED; st <= KVT_SLOT_FINISHED; ++st)
    if (s == short_state(st) || s == kvt_slot_state_str(st)) return st;
  return 0;
}

kvt_endpoint_config defaults() {
  kvt_endpoint_config c{};
  c.struct_size = sizeof c;
  c.max_clients = 64;
  c.allow_uid = -1;
  c.allow_gid = -1;
  c.client_buffer_bytes = 256 << 10;
  return c;
}

kvt_status validate(const kvt_endpoint_config &c, const char *fn) {
  if (c.max_clients < 1 || c.max_clients > 4096)
    return fail(KVT_ERR_INVALID_ARGUMENT, "%s: cfg->max_clients is %u, not 1 .. 4096", fn,
                c.max_clients);
  if (c.client_buffer_bytes < (4 << 10) || c.client_buffer_bytes > (uint64_t{64} << 20))
    return fail(KVT_ERR_INVALID_ARGUMENT,
                "%s: cfg->client_buffer_bytes is %llu, not 4 KiB .. 64 MiB", fn,
                (unsigned long long)c.client_buffer_bytes);
  if (c.allow_uid < -1 || c.allow_uid > int64_t(UINT32_MAX) - 1 || c.allow_gid < -1 ||
      c.allow_gid > int64_t(UINT32_MAX) - 1)
    return fail(KVT_ERR_INVALID_ARGUMENT,
                "%s: cfg->allow_uid (%lld) and allow_gid (%lld) are -1 or an id", fn,
                (long long)c.allow_uid, (long long)c.allow_gid);
  return KVT_OK;
}

obs::EndpointOps ops_for(kvt_manager *m, Manager *mgr, kvt_connector *c) {
  obs::EndpointOps ops;
  ops.tiers = [mgr](const json &, json *r) {
    json tiers = json::array();
    for (int t = KVT_TIER_G1; t <= KVT_TIER_G3; ++t) {
      Tier *tier = mgr->tier_if_present(t);
      if (tier == nullptr) continue;
      kvt_tier_stats s{};
      tier->stats(&s);
      tiers.push_back({{"tier", "G" + std::to_string(t)}, {"capacity", s.capacity},
                       {"free", s.free}, {"active", s.active}, {"inactive", s.inactive},
                       {"registered", s.registered}, {"pinned", s.pinned}});
    }
    (*r)["tiers"] = tiers;
    return std::string();
  };
  ops.metrics = [m, c](const json &, json *r) {
    size_t len = 0;
    kvt_metrics_text(nullptr, 0, &len, m, c);
    std::string text(len + 4096, '\0');
    if (kvt_metrics_text(text.data(), text.size(), &len, m, c) != KVT_OK)
      return std::string(kvt_last_error());
    text.resize(len);
    (*r)["text"] = text;
    return std::string();
  };
  if (c == nullptr || !c->sched) return ops;
  conn::Breakpoints &bp = c->sched->breakpoints();
  ops.slots = [c](const json &, json *r) {
    json slots = json::array();
    for (const kvt_slot_info &s : inspect(c).slots)
      slots.push_back({{"req_id", s.req_id}, {"state", short_state(s.state)},
                       {"age_ms", double(s.age_ns) / 1e6}, {"tokens", s.tokens},
                       {"computed", s.computed}, {"blocks", s.blocks},
                       {"batches", s.batches}});
    (*r)["slots"] = slots;
    return std::string();
  };
  ops.batches = [c](const json &, json *r) {
    json out = json::array();
    for (const kvt_batch_info &b : inspect(c).batches)
      out.push_back({{"batch", b.batch}, {"req_id", b.req_id}, {"src", "G" + std::to_string(b.src)},
                     {"dst", "G" + std::to_string(b.dst)}, {"blocks", b.blocks},
                     {"step", b.step}});
    (*r)["batches"] = out;
    return std::string();
  };
  ops.add_breakpoint = [&bp](const json &req, json *r) {
    uint32_t state = req.contains("state") ? parse_state(req["state"]) : 0;
    if (req.contains("state") && state == 0)
      return std::string("\"state\" is not a slot state (INITIALIZED ... FINISHED)");
    std::string id;
    if (req.contains("req_id")) {
      if (!req["req_id"].is_string()) return std::string("\"req_id\" must be a string");
      id = req["req_id"].get<std::string>();
      if (id.empty() || id.size() > KVT_REQ_ID_MAX)
        return std::string("\"req_id\" must have 1 to 255 bytes");
    }
    if (state == 0 && id.empty()) return std::string("a breakpoint needs \"state\" or \"req_id\"");
    const uint64_t added = bp.add(state, id);
    if (added == 0)
      return std::to_string(KVT_MAX_BREAKPOINTS) +
             " breakpoints are set already, the most there may be";
    (*r)["id"] = added;
    return std::string();
  };
  ops.remove_breakpoint = [&bp](const json &req, json *) {
    if (!req.contains("id")) {
      bp.clear();
      return std::string();
    }
    if (!req["id"].is_number_unsigned() || !bp.remove(req["id"].get<uint64_t>()))
      return std::string("no such breakpoint");
    return std::string();
  };
  ops.pause = [&bp](const json &, json *) {
    bp.pause_next();
    return std::string();
  };
  ops.resume = [&bp](const json &, json *) {
    return bp.resume() == KVT_OK ? std::string() : std::string("nothing is paused");
  };
  ops.paused = [&bp](const json &, json *r) {
    kvt_pause_info p{};
    const bool paused = bp.wait_paused(&p, std::chrono::milliseconds(0)) == KVT_OK;
    (*r)["paused"] = paused;
    if (paused) {
      (*r)["req_id"] = p.req_id;
      (*r)["from"] = p.prev ? short_state(p.prev) : "";
      (*r)["to"] = p.state ? short_state(p.state) : "";
      (*r)["trigger"] = kvt_obs_trigger_str(p.trigger);
      (*r)["breakpoint"] = p.breakpoint;
    }
    return std::string();
  };
  return ops;
}

}  // namespace

extern "C" {

KVT_API void kvt_endpoint_config_init_sized(kvt_endpoint_config *cfg, size_t size) {
  if (cfg == nullptr) return;
  if (check_struct_size<kvt_endpoint_config>("kvt_endpoint_config_init_sized", "cfg", size) !=
      KVT_OK) {
    if (size >= sizeof cfg->struct_size) cfg->struct_size = uint32_t(std::min<size_t>(size, UINT32_MAX));
    return;
  }
  kvt_endpoint_config full = defaults();
  full.struct_size = uint32_t(size);
  std::memcpy(static_cast<void *>(cfg), &full, size);
}

KVT_API kvt_status kvt_endpoint_open_with(kvt_endpoint **out, kvt_manager *m, kvt_connector *c,
                                          const char *path, const kvt_endpoint_config *cfg) {
  static constexpr const char *fn = "kvt_endpoint_open";
  if (out == nullptr) return null_arg(fn, "out");
  if (path == nullptr) return null_arg(fn, "path");
  kvt_endpoint_config full = defaults();
  if (cfg != nullptr) {
    if (kvt_status st = read_versioned(&full, *cfg, fn, "cfg"); st != KVT_OK) return st;
    if (kvt_status st = validate(full, fn); st != KVT_OK) return st;
  }
  return on_manager(fn, m, [&](Manager &mgr) {
    if (c != nullptr) {
      kvt_status st;
      if (connector(fn, c, &st) == nullptr) return st;
      if (c->mgr != &mgr)
        return fail(KVT_ERR_INVALID_ARGUMENT, "%s: the connector belongs to another manager", fn);
    }
    if (kvt_status st = endpoint_open(out, m, mgr, c, path, &full); st != KVT_OK)
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

kvt_status endpoint_open(kvt_endpoint **out, kvt_manager *m, Manager &mgr, kvt_connector *c,
                         const char *path, const kvt_endpoint_config *cfg) {
  const kvt_endpoint_config full = cfg != nullptr ? *cfg : defaults();
  obs::EndpointLimits limits;
  limits.access.uid = full.allow_uid;
  limits.access.gid = full.allow_gid;
  limits.max_clients = full.max_clients;
  limits.client_buffer = full.client_buffer_bytes;
  auto e = std::make_unique<kvt_endpoint>();
  if (kvt_status st = e->impl.open(path, mgr.bus_ptr(), ops_for(m, &mgr, c), limits);
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
