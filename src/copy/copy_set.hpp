// The block copies of one batch, run together: the pipeline's executor adds whole blocks, the
// connector's worker one layer of each block at a time, and both run them the same way.
// Host-to-host copies go through the memcpy engine (split across the worker pool), anything
// touching CUDA memory through the CUDA engine's stream of that direction. Each copy names
// an owner (the caller's index of what it serves), so that a failed CUDA copy fails only
// the owners of its direction.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "copy/memcpy_engine.hpp"
#include "kvtier.h"

namespace kvt {

class CudaEngine;

class CopySet {
 public:
  explicit CopySet(const Geometry &g) : g_(g) {}

  void add(const BlockCopy &c, size_t owner);                    // the whole block
  void add_layer(const BlockCopy &c, uint32_t layer, size_t owner);
  bool empty() const noexcept;

  struct Failure {
    size_t owner;
    kvt_status status;
    std::string message;
  };
  // Runs every copy and returns once all are done, with a Failure for each copy that
  // failed (an owner may be named more than once). cuda may be null when no copy touches
  // CUDA memory: one that does then fails with KVT_ERR_UNSUPPORTED.
  std::vector<Failure> run(CudaEngine *cuda, WorkerPool &pool) const;

 private:
  // The copies of one direction across PCIe, made into runs only as the engine takes them.
  struct Device {
    std::vector<SegmentCursor::Part> parts;
    std::vector<size_t> owner;
  };
  Device *device_of(const BlockCopy &c);

  const Geometry &g_;
  std::vector<BlockCopy> host_blocks_;  // whole blocks, host to host
  std::vector<Segment> host_segs_;      // layers, host to host
  Device h2d_, d2h_;
};

}  // namespace kvt
