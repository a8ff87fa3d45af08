// kvt_metrics_text: the Prometheus text exposition (format 0.0.4) of what the layers count.
// The ABI gathers the numbers; this only formats them.
#pragma once

#include <cstdint>
#include <string>

#include "kvtier.h"
#include "common/direction.hpp"
#include "common/latency.hpp"

namespace kvt::obs {

struct MetricsInput {
  bool tier_present[4] = {};       // by kvt_tier, G1..G3
  kvt_tier_stats tier[4] = {};
  kvt_transfer_stats transfer[kDirections] = {};
  Latency latency[kDirections];
  bool has_connector = false;      // with a scheduler half: the slot families
  uint64_t slots[11] = {};         // live slots by kvt_slot_state
  kvt_connector_stats connector = {};
  uint64_t events_emitted = 0, subscriber_drops = 0, log_drops = 0, poll_drops = 0;
};

std::string metrics_text(const MetricsInput &in);

}  // namespace kvt::obs
