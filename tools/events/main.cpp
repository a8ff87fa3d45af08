// kvtier-events: reads an event log (kvt_manager_recorder_open, kvtier-replay --record) and prints
// it as text or as one JSON object per line, for every request or one; with --request and
// without --json, that request's timeline and the time it spent in each slot state. A log
// whose tail a killed writer tore is read to its last whole record: the cut is reported on
// stderr and the exit status stays 0. See docs/EVENTS.md.
#include <cinttypes>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "kvtier.h"

namespace {

const char *tier(uint32_t t) {
  static constexpr const char *names[] = {"-", "G1", "G2", "G3", "G4"};
  return t < 5 ? names[t] : "G?";
}

// "PREFILLING" for KVT_SLOT_PREFILLING; "-" for the 0 of a new slot.
std::string state(uint32_t s) {
  if (s == 0) return "-";
  std::string n = kvt_slot_state_str(s);
  return n.rfind("KVT_SLOT_", 0) == 0 ? n.substr(9) : n;
}

double ms(uint64_t ns) { return double(ns) / 1e6; }

std::string text(const kvt_obs_event &e, uint64_t t0) {
  char head[96], body[512];
  std::snprintf(head, sizeof head, "#%-8" PRIu64 " %+11.3f ms  %-13s ", e.seq,
                e.seq ? ms(e.time_ns - t0) : 0.0, kvt_obs_kind_str(e.kind));
  switch (e.kind) {
    case KVT_OBS_SLOT:
      std::snprintf(body, sizeof body, "%s  %s -> %s  by %s  tokens %" PRIu64 " computed %" PRIu64,
                    e.req_id, state(e.prev).c_str(), state(e.state).c_str(),
                    kvt_obs_trigger_str(e.trigger), e.tokens, e.computed);
      break;
    case KVT_OBS_CANDIDATE:
      std::snprintf(body, sizeof body,
                    "%s  %s  batch %" PRIu64 "  %s -> %s  %" PRIu64 " blocks%s%s",
                    e.req_id, kvt_candidate_state_str(e.state), e.batch, tier(e.src), tier(e.dst),
                    e.blocks, e.status ? "  " : "", e.status ? kvt_status_str(e.status) : "");
      break;
    case KVT_OBS_BLOCK_STORED:
      std::snprintf(body, sizeof body, "%s  hash %016" PRIx64 "  parent %016" PRIx64, tier(e.dst),
                    e.hash, e.parent_hash);
      break;
    case KVT_OBS_BLOCK_REMOVED:
      std::snprintf(body, sizeof body, "%s  hash %016" PRIx64, tier(e.dst), e.hash);
      break;
    case KVT_OBS_TIER_CLEARED:
      std::snprintf(body, sizeof body, "%s", tier(e.dst));
      break;
    case KVT_OBS_TRANSFER:
      std::snprintf(body, sizeof body, "%s%s%s -> %s  %s  %" PRIu64 " blocks  %" PRIu64
                    " bytes  %.3f ms%s",
                    e.req_id, e.req_id[0] ? "  " : "", tier(e.src), tier(e.dst),
                    kvt_status_str(e.status), e.blocks, e.bytes, ms(e.duration_ns),
                    e.batch ? ("  batch " + std::to_string(e.batch)).c_str() : "");
      break;
    case KVT_OBS_CALL:
      std::snprintf(body, sizeof body,
                    "%s%s%s  %s  tokens %" PRIu64 " computed %" PRIu64 " blocks %" PRIu64
                    "  -> %" PRIu64 "  (%" PRIu64 " argument bytes)",
                    e.req_id, e.req_id[0] ? "  " : "", kvt_obs_trigger_str(e.trigger),
                    kvt_status_str(e.status), e.tokens, e.computed, e.blocks, e.count, e.bytes);
      break;
    default:
      std::snprintf(body, sizeof body, "%" PRIu64 " events lost", e.count);
  }
  return std::string(head) + body;
}

// kvt_obs_event_json: the library's mapping, which the management endpoint uses too.
std::string to_json(const kvt_obs_event &e) {
  size_t len = 0;
  kvt_obs_event_json(nullptr, 0, &len, &e);
  std::string text(len + 1, '\0');
  if (kvt_obs_event_json(text.data(), text.size(), &len, &e) != KVT_OK) return "{}";
  text.resize(len);
  return text;
}

// One request's time per slot state, from its SLOT events to its last event.
void print_state_times(const std::vector<kvt_obs_event> &ev) {
  std::map<std::string, uint64_t> spent;
  const kvt_obs_event *in = nullptr;
  uint64_t last = 0;
  for (const kvt_obs_event &e : ev) {
    last = e.time_ns;
    if (e.kind != KVT_OBS_SLOT) continue;
    if (in) spent[state(in->state)] += e.time_ns - in->time_ns;
    in = &e;
  }
  if (in && state(in->state) != "FINISHED") spent[state(in->state)] += last - in->time_ns;
  std::printf("time per state:");
  for (const auto &[s, ns] : spent) std::printf("  %s %.3f ms", s.c_str(), ms(ns));
  std::printf("\n");
}

}  // namespace

int main(int argc, char **argv) {
  CLI::App app{"kvtier-events: print a kvtier event log (docs/EVENTS.md)"};
  std::string path, request;
  bool json = false;
  app.add_option("FILE", path, "the event log")->required();
  app.add_flag("--json", json, "one JSON object per event and line");
  app.add_option("--request", request,
                 "only this request's events; as text, its timeline and its time per state");
  CLI11_PARSE(app, argc, argv);

  kvt_event_log *log = nullptr;
  if (kvt_event_log_open(&log, path.c_str()) != KVT_OK) {
    std::fprintf(stderr, "kvtier-events: %s\n", kvt_last_error());
    return 2;
  }
  std::vector<kvt_obs_event> mine;
  kvt_obs_event e;
  kvt_status st;
  uint64_t t0 = 0, n = 0;
  while ((st = kvt_event_log_read(&e, log)) == KVT_OK) {
    if (t0 == 0 && e.seq) t0 = e.time_ns;
    if (!request.empty() && request != e.req_id) continue;
    ++n;
    if (json) {
      std::printf("%s\n", to_json(e).c_str());
    } else if (!request.empty()) {
      if (mine.empty()) std::printf("request %s\n", request.c_str());
      mine.push_back(e);
      std::printf("%s\n", text(e, mine.front().time_ns).c_str());
    } else {
      std::printf("%s\n", text(e, t0).c_str());
    }
  }
  const bool torn = st == KVT_ERR_CORRUPT;
  if (torn) std::fprintf(stderr, "kvtier-events: %s\n", kvt_last_error());
  kvt_event_log_close(log);
  if (st != KVT_ITEROVER && !torn) {
    std::fprintf(stderr, "kvtier-events: %s\n", kvt_last_error());
    return 2;
  }
  if (!request.empty() && n == 0) {
    std::fprintf(stderr, "kvtier-events: no event names request '%s'\n", request.c_str());
    return 1;
  }
  if (!json && !request.empty()) print_state_times(mine);
  return 0;
}
