#include "manage/endpoint_ops.hpp"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstring>
#include <string>

#include "common/error.hpp"
#include "common/names.hpp"
#include "connector/connector.hpp"
#include "manage/metrics.hpp"
#include "manager/manager.hpp"

namespace kvt::manage {

using json = obs::Json;

namespace {

const char *short_state(uint32_t s) {
  const char *n = slot_state_name(s);
  return std::strncmp(n, "KVT_SLOT_", 9) == 0 ? n + 9 : n;
}

// "ONBOARDING", "onboarding", "KVT_SLOT_ONBOARDING" or 3: the state; 0 when none.
uint32_t parse_state(const json &v) {
  if (v.is_number_unsigned())  // compared whole: 2^32 + 3 is no state
    return v.get<uint64_t>() <= KVT_SLOT_FINISHED ? uint32_t(v.get<uint64_t>()) : 0;
  if (!v.is_string()) return 0;
  std::string s = v.get<std::string>();
  for (char &ch : s) ch = char(std::toupper(static_cast<unsigned char>(ch)));
  for (uint32_t st = KVT_SLOT_INITIALIZED; st <= KVT_SLOT_FINISHED; ++st)
    if (s == short_state(st) || s == slot_state_name(st)) return st;
  return 0;
}

}  // namespace

kvt_endpoint_config endpoint_defaults() noexcept {
  kvt_endpoint_config c{};
  c.struct_size = sizeof c;
  c.max_clients = 64;
  c.allow_uid = -1;
  c.allow_gid = -1;
  c.client_buffer_bytes = 256 << 10;
  return c;
}

kvt_status validate_endpoint(const kvt_endpoint_config &c, const char *fn) {
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

obs::EndpointLimits endpoint_limits(const kvt_endpoint_config &c) noexcept {
  obs::EndpointLimits limits;
  limits.access.uid = c.allow_uid;
  limits.access.gid = c.allow_gid;
  limits.max_clients = c.max_clients;
  limits.client_buffer = c.client_buffer_bytes;
  return limits;
}

obs::EndpointOps endpoint_ops(Manager &mgr, conn::Connector *c) {
  obs::EndpointOps ops;
  ops.tiers = [&mgr](const json &, json *r) {
    json tiers = json::array();
    for (int t = KVT_TIER_G1; t <= KVT_TIER_G3; ++t) {
      Tier *tier = mgr.tier_if_present(t);
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
  ops.metrics = [&mgr, c](const json &, json *r) {
    std::string text;
    if (manage::metrics_text(&text, mgr, c) != KVT_OK) return std::string(last_error());
    (*r)["text"] = text;
    return std::string();
  };
  if (c == nullptr || c->scheduler() == nullptr) return ops;
  conn::Breakpoints &bp = c->scheduler()->breakpoints();
  ops.slots = [c](const json &, json *r) {
    json slots = json::array();
    for (const kvt_slot_info &s : c->inspect().slots)
      slots.push_back({{"req_id", s.req_id}, {"state", short_state(s.state)},
                       {"age_ms", double(s.age_ns) / 1e6}, {"tokens", s.tokens},
                       {"computed", s.computed}, {"blocks", s.blocks},
                       {"batches", s.batches}});
    (*r)["slots"] = slots;
    return std::string();
  };
  ops.batches = [c](const json &, json *r) {
    json out = json::array();
    for (const kvt_batch_info &b : c->inspect().batches)
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
    const bool paused = bp.wait_paused(&p, std::chrono::nanoseconds(0));
    (*r)["paused"] = paused;
    if (paused) {
      (*r)["req_id"] = p.req_id;
      (*r)["from"] = p.prev ? short_state(p.prev) : "";
      (*r)["to"] = p.state ? short_state(p.state) : "";
      (*r)["trigger"] = trigger_name(p.trigger);
      (*r)["breakpoint"] = p.breakpoint;
    }
    return std::string();
  };
  return ops;
}

}  // namespace kvt::manage
