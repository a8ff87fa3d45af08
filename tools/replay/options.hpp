// kvtier-replay's settings, as parsed from its command line.
#pragma once

#include <cstdint>
#include <string>

namespace kvt::replay {

enum class Offload { Eager, Lazy };

struct Options {
  std::string trace;
  uint32_t page_size = 512;
  uint64_t g1_blocks = 4000, g2_blocks = 20000, g3_blocks = 60000;
  uint32_t layers = 1, outer = 2;
  uint64_t chunk_bytes = 16384;
  uint32_t concurrency = 1;
  Offload offload = Offload::Eager;
  uint32_t min_frequency = 0;  // 0: presence policy; N: frequency N (with presence)
  std::string g3_path;         // empty: a temporary directory
  bool json = false;
  std::string timeline_csv, plot_svg;
  double interval_s = 60;      // timeline bucket width in trace time
  bool progress = true;        // a progress bar, when stderr is a terminal
  bool prefault = true;        // touch every page of G1 and G2 before the replay

  uint64_t block_bytes() const { return uint64_t(layers) * outer * chunk_bytes; }
};

}  // namespace kvt::replay
