// The one mapping of an observe event to JSON (docs/EVENTS.md, "Events as JSON"): the
// management endpoint's events and kvt_obs_event_json, which kvtier-events --json and the
// bindings' to_json use. Names, not numbers: kinds, slot states without their KVT_SLOT_
// prefix ("-" for a new slot's 0), tiers as "G2", statuses as "KVT_OK".
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "kvtier.h"

namespace kvt::obs {

nlohmann::ordered_json event_json(const kvt_obs_event &e);
// event_json on one line. Request ids are the engine's bytes, not necessarily UTF-8: bytes
// that are not are replaced (U+FFFD), never thrown on.
std::string event_json_text(const kvt_obs_event &e);
std::string json_line(const nlohmann::ordered_json &j);  // the same rule for any value

}  // namespace kvt::obs
