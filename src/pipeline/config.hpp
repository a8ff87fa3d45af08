// The pipeline's settings, translated from kvt_manager_config by the manager, which has
// validated them.
#pragma once

#include <chrono>
#include <cstdint>

#include "common/direction.hpp"
#include "kvtier.h"

namespace kvt {

struct PipelineConfig {
  uint32_t max_batch_size = 64;  // blocks per batch
  uint32_t min_batch_size = 8;   // blocks that flush a batch early
  std::chrono::microseconds flush_interval{10000};   // a partial batch waits at most this
  std::chrono::microseconds policy_timeout{100000};  // one container's policy evaluation
  std::chrono::microseconds sweep_interval{10000};   // polls of conditions that cannot wake it
  uint32_t executors = 1;                             // batches in flight at once
  kvt_policy policies[kOffloadDirections] = {};       // by Direction: G1toG2, G1toG3, G2toG3
};

}  // namespace kvt
