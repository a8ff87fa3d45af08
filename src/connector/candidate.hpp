// The observe CANDIDATE event of a connector batch, emitted by the scheduler half and both
// of its planners.
#pragma once

#include <cstdint>

#include "connector/slot.hpp"
#include "event/obs_sink.hpp"
#include "kvtier.h"

namespace kvt::conn {

// Batch 0: blocks not in a batch (staged, skipped, or waiting for a lazy store).
inline void candidate_event(ObsSink &bus, const Slot &s, kvt_candidate_state state,
                            uint64_t batch, int src, int dst, uint64_t blocks,
                            kvt_status st = KVT_OK) {
  if (!bus.on()) return;
  ObsEvent e = obs_event(KVT_OBS_CANDIDATE, s.id);
  e.state = state;
  e.batch = batch;
  e.src = uint32_t(src);
  e.dst = uint32_t(dst);
  e.blocks = blocks;
  e.status = st;
  bus.emit(e);
}

}  // namespace kvt::conn
