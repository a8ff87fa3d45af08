#include "connector/log_rerun.hpp"

#include <xxhash.h>

#include <cstdio>
#include <cstring>

#include "block/tier.hpp"
#include "common/error.hpp"
#include "common/names.hpp"
#include "connector/call_args.hpp"
#include "connector/metadata.hpp"
#include "connector/scheduler.hpp"
#include "event/obs_sink.hpp"
#include "manager/manager.hpp"

namespace kvt::conn {

void LogRerun::apply(const kvt_obs_event &e, const std::string &args) {
  events_.apply(e);
  if (e.kind == KVT_OBS_CALL) call(e, args);
}

void LogRerun::call(const kvt_obs_event &e, const std::string &args) {
  ++calls_;
  char what[KVT_REQ_ID_MAX + 96];
  std::snprintf(what, sizeof what, "call %llu (%s%s%s%s)", (unsigned long long)calls_,
                trigger_name(e.trigger), e.req_id[0] ? " '" : "", e.req_id,
                e.req_id[0] ? "'" : "");
  // A refused schedule changed nothing and is logged without its arguments.
  if (e.trigger == KVT_TRIGGER_BUILD_CONNECTOR_META && e.status != KVT_OK && args.empty())
    return;
  const bool needs_args = e.trigger != KVT_TRIGGER_REQUEST_FINISHED &&
                          e.trigger != KVT_TRIGGER_REQUEST_PREEMPTED &&
                          e.trigger != KVT_TRIGGER_RESET_CACHE;
  if (needs_args && args.empty())
    return events_.violation("%s: the log holds no arguments for it (recorded while no log or ring "
                   "kept events, or too big)", what);
  CallArgs a;
  if (decode_call(&a, e.trigger, reinterpret_cast<const uint8_t *>(args.data()), args.size()) !=
      KVT_OK)
    return events_.violation("%s: %s", what, last_error());
  kvt_status st = KVT_OK;
  uint64_t result = 0;  // what the CALL event's count records
  switch (e.trigger) {
    case KVT_TRIGGER_GET_NUM_NEW_MATCHED_TOKENS: {
      if (a.own_tokens) {
        auto it = tokens_.find(e.req_id);
        if (it == tokens_.end() || it->second.size() != a.num_tokens)
          return events_.violation("%s: logged with the slot's own %llu tokens, which the rerun lacks",
                         what, (unsigned long long)a.num_tokens);
        a.ids = it->second;
      }
      st = s_.get_num_new_matched_tokens(&result, e.req_id, a.salted ? a.salt : s_.salt(),
                                         a.ids.data(), a.ids.size(), a.number,
                                         a.max_tokens);
      if (st == KVT_OK) tokens_[e.req_id] = std::move(a.ids);
      break;
    }
    case KVT_TRIGGER_UPDATE_STATE_AFTER_ALLOC:
      st = s_.update_state_after_alloc(e.req_id, a.ids.data(), a.ids.size(), a.number);
      break;
    case KVT_TRIGGER_BUILD_CONNECTOR_META: {
      std::string meta;
      const std::vector<kvt_scheduled_request> reqs = a.schedule();
      st = s_.build_connector_meta(&meta, reqs.data(), reqs.size());
      if (st == KVT_OK)
        for (const CallArgs::Scheduled &r : a.reqs)
          if (auto it = tokens_.find(r.req_id); it != tokens_.end())
            it->second.insert(it->second.end(), r.tokens.begin(), r.tokens.end());
      if (st == KVT_OK && e.status == KVT_OK) {
        result = meta.size();
        if (XXH64(meta.data(), meta.size(), 0) != e.hash)
          return events_.violation("%s: the metadata differs from the recorded one", what);
      }
      break;
    }
    case KVT_TRIGGER_UPDATE_CONNECTOR_OUTPUT: {
      Report r;
      if (decode(&r, a.report.data(), a.report.size()) != KVT_OK)
        return events_.violation("%s: the recorded report: %s", what, last_error());
      st = s_.update_connector_output(r);
      break;
    }
    case KVT_TRIGGER_REQUEST_FINISHED: {
      bool delay = false;
      st = s_.request_finished(&delay, e.req_id);
      result = delay;
      if (st == KVT_OK) tokens_.erase(e.req_id);
      break;
    }
    case KVT_TRIGGER_REQUEST_PREEMPTED:
      st = s_.request_preempted(e.req_id);
      break;
    case KVT_TRIGGER_RESET_CACHE:
      st = s_.reset_cache();
      break;
  }
  if (st != e.status)
    return events_.violation("%s: ends with %s, recorded %s", what, status_name(st),
                   status_name(e.status));
  if (st == KVT_OK && result != e.count)
    events_.violation("%s: returns %llu, recorded %llu", what, (unsigned long long)result,
            (unsigned long long)e.count);
}

void LogRerun::finish(kvt_log_replay *out, std::string *first) {
  // The end state against the one the events describe ("event #N" is the log's last).
  if (calls_ == 0 && events_.events() > 0)
    events_.violation("the log holds no CALL events (schema 1, or no connector): nothing to make again");

  const Snapshot snap = s_.snapshot();
  const auto &want = events_.slots();
  if (snap.slots.size() != want.size())
    events_.violation("the rerun ends with %zu live slots; the log's events leave %zu",
            snap.slots.size(), want.size());
  for (const kvt_slot_info &si : snap.slots) {
    auto it = want.find(si.req_id);
    if (it == want.end())
      events_.violation("the rerun's slot '%s' is not live in the log's events", si.req_id);
    else if (it->second != si.state)
      events_.violation("slot '%s' ends %s in the rerun and %s in the log's events", si.req_id,
              slot_state_name(si.state), slot_state_name(it->second));
  }
  for (int t = KVT_TIER_G1; t <= KVT_TIER_G3; ++t) {
    Tier *tier = m_.tier_if_present(t);
    const auto &logged = events_.registered(t);
    const std::vector<uint64_t> held = tier ? tier->hashes() : std::vector<uint64_t>{};
    size_t missing = 0;
    for (uint64_t h : held) missing += !logged.contains(h);
    if (missing || held.size() != logged.size())
      events_.violation("G%d holds %zu hashes after the rerun, %zu of them not in the log's %zu", t,
              held.size(), missing, logged.size());
  }
  // With every slot finished and every batch ended, no block may stay protected.
  for (int t = KVT_TIER_G1; t <= KVT_TIER_G3 && want.empty() && events_.open_batches() == 0;
       ++t) {
    Tier *tier = m_.tier_if_present(t);
    kvt_tier_stats ts{};
    ts.struct_size = sizeof ts;
    if (tier != nullptr) tier->stats(&ts);
    if (ts.active != 0)
      events_.violation("G%d still pins %llu blocks with no slot live and no batch in flight", t,
              (unsigned long long)ts.active);
  }
  kvt_connector_stats st{};
  s_.stats(&st);
  if (std::memcmp(st.transitions, events_.transitions(), sizeof st.transitions) != 0)
    events_.violation("the rerun's slot transitions differ from the log's");

  events_.result(out, first);
  out->calls = calls_;
}

}  // namespace kvt::conn
