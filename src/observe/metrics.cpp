#include "observe/metrics.hpp"

#include <cstdarg>
#include <cstdio>

#include "common/names.hpp"

namespace kvt::obs {
namespace {

const char *kTierNames[] = {"", "G1", "G2", "G3", "G4"};

// "KVT_SLOT_PREFILLING" -> "prefilling"
std::string state_label(uint32_t s) {
  std::string n = slot_state_name(s);
  if (n.rfind("KVT_SLOT_", 0) == 0) n = n.substr(9);
  for (char &c : n) c = char(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  return n;
}

class Out {
 public:
  void family(const char *name, const char *type, const char *help) {
    line("# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
  }
  [[gnu::format(printf, 2, 3)]] void line(const char *fmt, ...) {
    char b[512];
    va_list ap;
    va_start(ap, fmt);
    int n = std::vsnprintf(b, sizeof b, fmt, ap);
    va_end(ap);
    s.append(b, size_t(n < 0 ? 0 : n < int(sizeof b) ? n : int(sizeof b) - 1));
  }
  std::string s;
};

}  // namespace

std::string metrics_text(const MetricsInput &in) {
  Out o;
  auto per_tier = [&](const char *name, const char *type, const char *help, auto field) {
    o.family(name, type, help);
    for (int t = KVT_TIER_G1; t <= KVT_TIER_G3; ++t)
      if (in.tier_present[t])
        o.line("%s{tier=\"%s\"} %llu\n", name, kTierNames[t],
               (unsigned long long)field(in.tier[t]));
  };
  per_tier("kvtier_tier_hits_total", "counter", "Hashes kvt_tier_match_prefix found in the tier.",
           [](const kvt_tier_stats &s) { return s.match_hit; });
  per_tier("kvtier_tier_misses_total", "counter",
           "Hashes kvt_tier_match_prefix asked the tier for and did not find.",
           [](const kvt_tier_stats &s) { return s.match_queried - s.match_hit; });
  per_tier("kvtier_tier_capacity_blocks", "gauge", "Blocks the tier can hold.",
           [](const kvt_tier_stats &s) { return s.capacity; });
  per_tier("kvtier_tier_evictions_total", "counter", "Inactive blocks evicted for allocations.",
           [](const kvt_tier_stats &s) { return s.evictions; });
  o.family("kvtier_tier_blocks", "gauge",
           "Blocks per tier and state: free, active (referenced), inactive (matchable, "
           "evictable), retired; pinned blocks are also active or inactive.");
  for (int t = KVT_TIER_G1; t <= KVT_TIER_G3; ++t) {
    if (!in.tier_present[t]) continue;
    const kvt_tier_stats &s = in.tier[t];
    const std::pair<const char *, uint64_t> states[] = {{"free", s.free},
                                                        {"active", s.active},
                                                        {"inactive", s.inactive},
                                                        {"retired", s.retired},
                                                        {"pinned", s.pinned}};
    for (const auto &[st, n] : states)
      o.line("kvtier_tier_blocks{tier=\"%s\",state=\"%s\"} %llu\n", kTierNames[t], st,
             (unsigned long long)n);
  }

  o.family("kvtier_transfers_total", "counter",
           "Transfers ended, per direction and result (a connector worker's batch counts "
           "once per tier it touched).");
  for (size_t d = 0; d < kDirections; ++d) {
    const DirectionInfo &i = kDirectionTable[d];
    const kvt_transfer_stats &x = in.transfer[d];
    const std::pair<const char *, uint64_t> results[] = {
        {"completed", x.completed}, {"cancelled", x.cancelled}, {"failed", x.failed}};
    for (const auto &[r, n] : results)
      o.line("kvtier_transfers_total{src=\"%s\",dst=\"%s\",result=\"%s\"} %llu\n",
             kTierNames[i.src], kTierNames[i.dst], r, (unsigned long long)n);
  }
  o.family("kvtier_transfer_bytes_total", "counter", "Bytes that arrived, per direction.");
  for (size_t d = 0; d < kDirections; ++d)
    o.line("kvtier_transfer_bytes_total{src=\"%s\",dst=\"%s\"} %llu\n",
           kTierNames[kDirectionTable[d].src], kTierNames[kDirectionTable[d].dst],
           (unsigned long long)in.transfer[d].bytes);
  o.family("kvtier_transfer_blocks_total", "counter", "Blocks that arrived, per direction.");
  for (size_t d = 0; d < kDirections; ++d)
    o.line("kvtier_transfer_blocks_total{src=\"%s\",dst=\"%s\"} %llu\n",
           kTierNames[kDirectionTable[d].src], kTierNames[kDirectionTable[d].dst],
           (unsigned long long)in.transfer[d].blocks);
  o.family("kvtier_transfer_duration_seconds", "histogram",
           "Transfer durations per direction: enqueue to end in the pipeline, the copies of "
           "a batch in a connector worker.");
  for (size_t d = 0; d < kDirections; ++d) {
    const char *src = kTierNames[kDirectionTable[d].src], *dst = kTierNames[kDirectionTable[d].dst];
    const Latency &l = in.latency[d];
    uint64_t cum = 0;
    for (size_t b = 0; b < Latency::kBuckets; ++b) {
      cum += l.bucket[b];
      if (b + 1 < Latency::kBuckets)
        o.line("kvtier_transfer_duration_seconds_bucket{src=\"%s\",dst=\"%s\",le=\"%g\"} %llu\n",
               src, dst, Latency::kBounds[b], (unsigned long long)cum);
      else
        o.line("kvtier_transfer_duration_seconds_bucket{src=\"%s\",dst=\"%s\",le=\"+Inf\"} %llu\n",
               src, dst, (unsigned long long)cum);
    }
    o.line("kvtier_transfer_duration_seconds_sum{src=\"%s\",dst=\"%s\"} %.9f\n", src, dst,
           double(l.sum_ns) * 1e-9);
    o.line("kvtier_transfer_duration_seconds_count{src=\"%s\",dst=\"%s\"} %llu\n", src, dst,
           (unsigned long long)l.count);
  }

  if (in.has_connector) {
    o.family("kvtier_slots", "gauge", "Live connector slots per seed 004 state.");
    for (uint32_t s = KVT_SLOT_INITIALIZED; s < KVT_SLOT_FINISHED; ++s)
      o.line("kvtier_slots{state=\"%s\"} %llu\n", state_label(s).c_str(),
             (unsigned long long)in.slots[s]);
    o.family("kvtier_slots_finished_total", "counter", "Requests whose slot finished.");
    o.line("kvtier_slots_finished_total %llu\n",
           (unsigned long long)in.connector.transitions[KVT_SLOT_FINISHING][KVT_SLOT_FINISHED]);
    o.family("kvtier_slot_transitions_total", "counter",
             "Slot transitions by from and to state (from \"none\": a new slot).");
    for (uint32_t f = 0; f < 11; ++f)
      for (uint32_t t = 1; t < 11; ++t)
        if (uint64_t n = in.connector.transitions[f][t])
          o.line("kvtier_slot_transitions_total{from=\"%s\",to=\"%s\"} %llu\n",
                 f ? state_label(f).c_str() : "none", state_label(t).c_str(),
                 (unsigned long long)n);
    const std::pair<const char *, uint64_t> counters[] = {
        {"loaded_blocks", in.connector.loaded_blocks},
        {"load_errors", in.connector.load_errors},
        {"stored_blocks", in.connector.stored_blocks},
        {"store_failures", in.connector.store_failures},
        {"preemptions", in.connector.preemptions},
        {"matched_tokens", in.connector.matched_tokens}};
    for (const auto &[n, v] : counters) {
      std::string name = std::string("kvtier_connector_") + n + "_total";
      o.family(name.c_str(), "counter", "kvt_connector_stats.");
      o.line("%s %llu\n", name.c_str(), (unsigned long long)v);
    }
  }

  o.family("kvtier_events_emitted_total", "counter",
           "Observe events numbered while someone read the stream.");
  o.line("kvtier_events_emitted_total %llu\n", (unsigned long long)in.events_emitted);
  o.family(
      "kvtier_events_dropped_total", "counter",
      "Events lost by readers that fell behind: subscriptions, the event log, kvt_manager_poll.");
  o.line("kvtier_events_dropped_total{reader=\"subscription\"} %llu\n",
         (unsigned long long)in.subscriber_drops);
  o.line("kvtier_events_dropped_total{reader=\"log\"} %llu\n", (unsigned long long)in.log_drops);
  o.line("kvtier_events_dropped_total{reader=\"poll\"} %llu\n", (unsigned long long)in.poll_drops);
  return std::move(o.s);
}

}  // namespace kvt::obs
