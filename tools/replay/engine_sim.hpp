// --mode engine: a small continuous-batching engine that owns G1 and reaches G2/G3 only
// through kvtier's connector (one process, role BOTH), the way vLLM drives a KV connector.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "options.hpp"
#include "replayer.hpp"
#include "trace.hpp"

namespace kvt::replay {

struct EngineResult {
  uint64_t requests = 0, steps = 0, preemptions = 0;
  uint64_t prompt_tokens = 0, output_tokens = 0;  // output: sampled tokens
  uint64_t computed_tokens = 0;    // tokens the "forward" computed (prefill and decode)
  uint64_t g1_hit_tokens = 0;      // the engine's own prefix cache
  uint64_t loaded_tokens = 0;      // accepted from get_num_new_matched_tokens and loaded
  uint64_t prefill_tokens_saved = 0;  // loaded without a load error: not computed
  uint64_t load_error_blocks = 0;  // loads the worker reported failed: recomputed
  uint64_t stored_blocks = 0, store_failures = 0;  // kvt_connector_stats
  uint64_t verified = 0, mismatched = 0;  // loaded G1 blocks checked against their hash
  uint64_t transitions[11][11] = {};      // kvt_connector_stats.transitions
  DirectionTotals dir[kDirections];       // the worker's copies (kvt_transfer_stats)
  double seconds = 0, prefault_seconds = 0;
  // Per step that computed tokens: the worker's side, bind to wait_for_save, around the
  // simulated forward; with --compare-bare, the same forwards again without the connector.
  std::vector<double> step_us, bare_step_us;
  // --verify-record: the log replayed into a fresh manager, against this run's end state.
  struct RecordReplay {
    bool done = false;
    kvt_log_replay r{};
    std::string first_violation;
    bool same_registry = false, same_transitions = false;
    double seconds = 0;
    // kvt_event_log_rerun into a fresh manager and connector, compared with this run's.
    kvt_log_replay rerun{};
    std::string rerun_first;
    bool rerun_same_slots = false, rerun_same_registry = false, rerun_same_counters = false;
    double rerun_seconds = 0;
  } record_replay;
};

// Replays the trace; false with *error when a connector call fails or the engine cannot make
// progress.
bool run_engine(const Options &o, const Trace &t, EngineResult *out, std::string *error);

}  // namespace kvt::replay
