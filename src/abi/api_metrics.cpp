// kvt_metrics_text: the numbers of every layer, as Prometheus text (src/observe/metrics.cpp).
#include <cstring>

#include "abi/guard.hpp"
#include "abi/objects.hpp"
#include "observe/metrics.hpp"

using namespace kvt;
using namespace kvt::abi;

extern "C" {

KVT_API kvt_status kvt_metrics_text(char *buf, size_t cap, size_t *len, kvt_manager *m,
                                    kvt_connector *c) {
  static constexpr const char *fn = "kvt_metrics_text";
  if (len == nullptr) return null_arg(fn, "len");
  if (kvt_status s = check_array(fn, "buf", buf, cap); s != KVT_OK) return s;
  return on_manager(fn, m, [&](Manager &mgr) {
    obs::MetricsInput in;
    if (c != nullptr) {
      Manager *owner = nullptr;
      if (kvt_status s = connector_metrics(fn, c, &owner, &in.has_connector, in.slots,
                                           &in.connector);
          s != KVT_OK)
        return s;
      if (owner != &mgr)
        return fail(KVT_ERR_INVALID_ARGUMENT, "%s: the connector belongs to another manager",
                    fn);
    }
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
    const std::string text = obs::metrics_text(in);
    *len = text.size();
    if (cap < text.size() + 1)
      return fail(KVT_ERR_INVALID_ARGUMENT, "%s: the text needs %zu bytes and a NUL; cap is %zu",
                  fn, text.size(), cap);
    std::memcpy(buf, text.c_str(), text.size() + 1);
    return KVT_OK;
  });
}

}  // extern "C"
