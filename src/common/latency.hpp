// A fixed-bucket histogram of transfer durations per direction, for kvt_metrics_text's
// Prometheus histograms. Buckets are cumulative only when printed.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvt {

struct Latency {
  // Upper bounds in seconds, then +Inf: 10 us to 10 s, about 3 per decade.
  static constexpr double kBounds[] = {1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2,
                                       3e-2, 1e-1, 3e-1, 1.0,  3.0,  10.0};
  static constexpr size_t kBuckets = sizeof kBounds / sizeof kBounds[0] + 1;

  uint64_t bucket[kBuckets] = {};  // bucket[i]: durations in (kBounds[i-1], kBounds[i]]
  uint64_t count = 0;
  uint64_t sum_ns = 0;

  void add(uint64_t ns) noexcept {
    const double s = double(ns) * 1e-9;
    size_t i = 0;
    while (i < kBuckets - 1 && s > kBounds[i]) ++i;
    ++bucket[i];
    ++count;
    sum_ns += ns;
  }
};

}  // namespace kvt
