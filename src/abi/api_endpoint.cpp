// kvt_endpoint: the management endpoint (src/observe/endpoint.cpp) wired to a manager and
// its connector.
#include <cctype>
#include <cstring>
#include <string>

#include "abi/connector_object.hpp"
#include "abi/guard.hpp"
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
    (*r)["id"] = bp.add(state, id);
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

KVT_API kvt_status kvt_endpoint_open(kvt_endpoint **out, kvt_manager *m, kvt_connector *c,
                                     const char *path) {
  static constexpr const char *fn = "kvt_endpoint_open";
  if (out == nullptr) return null_arg(fn, "out");
  if (path == nullptr) return null_arg(fn, "path");
  return on_manager(fn, m, [&](Manager &mgr) {
    if (c != nullptr) {
      kvt_status st;
      if (connector(fn, c, &st) == nullptr) return st;
      if (c->mgr != &mgr)
        return fail(KVT_ERR_INVALID_ARGUMENT, "%s: the connector belongs to another manager", fn);
    }
    if (kvt_status st = endpoint_open(out, m, mgr, c, path); st != KVT_OK)
      return fail(st, "%s: %s", fn, std::string(kvt_last_error()).c_str());
    return KVT_OK;
  });
}

KVT_API void kvt_endpoint_close(kvt_endpoint *e) { endpoint_close(e); }

}  // extern "C"

namespace kvt::abi {

kvt_status endpoint_open(kvt_endpoint **out, kvt_manager *m, Manager &mgr, kvt_connector *c,
                         const char *path) {
  auto e = std::make_unique<kvt_endpoint>();
  if (kvt_status st = e->impl.open(path, mgr.bus_ptr(), ops_for(m, &mgr, c)); st != KVT_OK)
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
