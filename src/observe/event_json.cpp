#include "observe/event_json.hpp"

#include <cstring>

#include "common/names.hpp"
#include "event/obs_sink.hpp"

namespace kvt::obs {

namespace {

const char *tier(uint32_t t) {
  static constexpr const char *names[] = {"-", "G1", "G2", "G3", "G4"};
  return t < 5 ? names[t] : "G?";
}

const char *state(uint32_t s) {
  if (s == 0) return "-";
  const char *n = slot_state_name(s);
  return std::strncmp(n, "KVT_SLOT_", 9) == 0 ? n + 9 : n;
}

}  // namespace

nlohmann::ordered_json event_json(const kvt_obs_event &e) {
  nlohmann::ordered_json j = {{"seq", e.seq}, {"time_ns", e.time_ns},
                              {"kind", obs_kind_name(e.kind)}};
  // A C caller's event may lack the NUL: the id is at most its array.
  const size_t id_len = strnlen(e.req_id, sizeof e.req_id);
  if (id_len > 0) j["req_id"] = std::string(e.req_id, id_len);
  switch (e.kind) {
    case KVT_OBS_SLOT:
      j["from"] = state(e.prev);
      j["to"] = state(e.state);
      j["trigger"] = trigger_name(e.trigger);
      j["tokens"] = e.tokens;
      j["computed"] = e.computed;
      break;
    case KVT_OBS_CANDIDATE:
      j["state"] = candidate_name(e.state);
      j["batch"] = e.batch;
      j["src"] = tier(e.src);
      j["dst"] = tier(e.dst);
      j["blocks"] = e.blocks;
      j["status"] = status_name(kvt_status(e.status));
      break;
    case KVT_OBS_BLOCK_STORED:
      j["parent_hash"] = e.parent_hash;
      [[fallthrough]];
    case KVT_OBS_BLOCK_REMOVED:
      j["hash"] = e.hash;
      [[fallthrough]];
    case KVT_OBS_TIER_CLEARED:
      j["tier"] = tier(e.dst);
      break;
    case KVT_OBS_TRANSFER:
      j["src"] = tier(e.src);
      j["dst"] = tier(e.dst);
      j["status"] = status_name(kvt_status(e.status));
      j["batch"] = e.batch;
      j["blocks"] = e.blocks;
      j["bytes"] = e.bytes;
      j["duration_ns"] = e.duration_ns;
      break;
    case KVT_OBS_CALL:
      j["trigger"] = trigger_name(e.trigger);
      j["status"] = status_name(kvt_status(e.status));
      j["tokens"] = e.tokens;
      j["computed"] = e.computed;
      j["blocks"] = e.blocks;
      j["result"] = e.count;
      if (e.hash) j["meta_hash"] = e.hash;
      j["arg_bytes"] = e.bytes;
      break;
    default:  // DROPPED, and kinds of a newer library
      j["count"] = e.count;
  }
  return j;
}

std::string json_line(const nlohmann::ordered_json &j) {
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

std::string event_json_text(const kvt_obs_event &e) { return json_line(event_json(e)); }

}  // namespace kvt::obs
