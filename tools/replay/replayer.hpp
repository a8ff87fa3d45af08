// Drives the real library over a trace the way a serving engine would: hash, match down the
// tiers, onboard, compute, register, offload, release.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "options.hpp"
#include "trace.hpp"

namespace kvt::replay {

// Transfer directions, in kvt_transfer_stats order.
enum Direction { G1G2, G1G3, G2G3, G2G1, G3G1, kDirections };
inline constexpr const char *kDirectionNames[kDirections] = {"G1->G2", "G1->G3", "G2->G3",
                                                             "G2->G1", "G3->G1"};

// What the requests found: the whole run's, or one timeline interval's.
struct Counts {
  uint64_t requests = 0, blocks = 0, hits[5] = {}, misses = 0;  // hits[tier]

  // One request of n blocks with h1, h2, h3, h4 hits in G1, G2, G3, G4; the rest missed.
  void add_request(uint64_t n, uint64_t h1, uint64_t h2, uint64_t h3, uint64_t h4 = 0) {
    requests += 1;
    blocks += n;
    hits[1] += h1;
    hits[2] += h2;
    hits[3] += h3;
    hits[4] += h4;
    misses += n - h1 - h2 - h3 - h4;
  }
  uint64_t hit_blocks() const { return hits[1] + hits[2] + hits[3] + hits[4]; }
};

// Counters of one timeline interval (requests by trace arrival time).
struct Interval : Counts {
  uint64_t offload_bytes = 0, onboard_bytes = 0;
  double wall_begin = 0, wall_end = 0;  // seconds since the replay began
};

struct DirectionTotals {
  uint64_t completed = 0, cancelled = 0, failed = 0, blocks = 0, bytes = 0, busy_ns = 0;
};

struct Result : Counts {
  uint64_t verified = 0, mismatched = 0;
  uint64_t g3_recovered = 0;  // blocks a kept G3 file held at start (--g3-keep)
  uint64_t g4_stored = 0, g4_failed = 0;  // kvt_g4_stats' stored_blocks and failed_blocks
  uint64_t alloc_waits = 0;  // allocations that waited for G1 space held by transfers
  DirectionTotals dir[kDirections];
  double seconds = 0;
  double prefault_seconds = 0;  // touching G1 and G2 before the replay, not in `seconds`
  std::vector<Interval> timeline;

  uint64_t offloaded_blocks() const { return dir[G1G2].blocks + dir[G1G3].blocks + dir[G2G3].blocks; }
  uint64_t onboarded_blocks() const {
    return dir[G2G1].blocks + dir[G3G1].blocks + hits[4];  // G4's: the blocks it served
  }
};

// Replays the trace. False with *error when the library refuses the configuration or a call
// fails in a way a serving engine could not recover from.
bool run_replay(const Options &o, const Trace &t, Result *out, std::string *error);

// --record: m's events from now on go to o.record (written out when m is destroyed).
bool start_recording(kvt_manager *m, const Options &o, std::string *error);

// The manager's kvt_transfer_stats of every direction, into dir[kDirections].
bool read_transfer_stats(kvt_manager *m, DirectionTotals *dir, std::string *error);

}  // namespace kvt::replay
