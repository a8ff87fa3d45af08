// Copies between host-visible blocks: whole blocks where both sides are contiguous, chunk by
// chunk where an engine layout scatters them, split across the worker pool when large.
#pragma once

#include <cstdint>
#include <vector>

#include "memory/tier_memory.hpp"
#include "copy/worker_pool.hpp"

namespace kvt {

// One block: a slot of a tier, or a contiguous staging buffer of block_bytes.
struct BlockRef {
  const TierMemory *mem = nullptr;
  uint32_t slot = 0;
  void *buf = nullptr;  // when set, the block is here instead
};

struct BlockCopy {
  BlockRef dst, src;
};

// One contiguous run of bytes to copy.
struct Segment {
  char *dst;
  const char *src;
  size_t len;
};

// The runs that make up copying one block: the whole block where both sides are contiguous,
// else one run per (layer, outer) chunk.
void append_segments(const Geometry &g, const BlockCopy &c, std::vector<Segment> &out);
// The same for one layer of the block: its num_outer chunks, one run where both sides are
// contiguous (a compact block holds a layer's chunks back to back).
void append_layer_segments(const Geometry &g, const BlockCopy &c, uint32_t layer,
                           std::vector<Segment> &out);

void copy_segments(const std::vector<Segment> &segs, WorkerPool &pool);
void copy_blocks(const Geometry &g, const std::vector<BlockCopy> &copies, WorkerPool &pool);

}  // namespace kvt
