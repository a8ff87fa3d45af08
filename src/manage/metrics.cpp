#include "manage/metrics.hpp"

#include "connector/connector.hpp"
#include "manager/manager.hpp"
#include "observe/metrics.hpp"

namespace kvt::manage {

kvt_status metrics_text(std::string *out, Manager &mgr, conn::Connector *c) {
  obs::MetricsInput in;
  if (c != nullptr) in.has_connector = c->slot_counts(in.slots, &in.connector);
  for (int t = KVT_TIER_G1; t <= KVT_TIER_G3; ++t) {
    if (Tier *tier = mgr.tier_if_present(t)) {
      in.tier_present[t] = true;
      tier->stats(&in.tier[t]);
    }
  }
  for (size_t d = 0; d < kDirections; ++d) {
    const DirectionInfo &i = kDirectionTable[d];
    if (kvt_status s = mgr.pipeline().transfer_stats(&in.transfer[d], i.src, i.dst);
        s != KVT_OK)
      return s;
    in.latency[d] = mgr.pipeline().latency(i.dir);
  }
  obs::Bus::Counts n = mgr.bus().counts();
  in.events_emitted = n.emitted;
  in.subscriber_drops = n.subscriber_drops;
  in.log_drops = n.log_drops;
  in.poll_drops = mgr.events().dropped_total();
  *out = obs::metrics_text(in);
  return KVT_OK;
}

}  // namespace kvt::manage
