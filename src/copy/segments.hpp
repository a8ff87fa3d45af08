// What a copy is made of: blocks (a tier's slot, or a staging buffer) and the contiguous runs
// of bytes that copying one comes down to, whole blocks where both sides are contiguous, one
// run per (layer, outer) chunk where an engine layout scatters them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "memory/tier_memory.hpp"

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

// The runs of a list of copies (whole blocks, or one layer of each), made a few at a time in
// order rather than all up front: the CUDA engine writes them straight into its kernel's
// table and launches the first ones while it makes the rest.
class SegmentCursor {
 public:
  static constexpr uint32_t kWholeBlock = UINT32_MAX;
  struct Part {
    BlockCopy copy;
    uint32_t layer;  // kWholeBlock, or the one layer to copy
  };
  SegmentCursor(const Geometry &g, std::span<const Part> parts);

  size_t size() const noexcept { return total_; }  // every run, made or not
  // The next runs, up to cap of them; 0 once every run was made.
  size_t next(Segment *out, size_t cap);

 private:
  const Geometry &g_;
  std::span<const Part> parts_;
  size_t total_ = 0;
  size_t part_ = 0;  // the part being made, and its next (layer, outer) pair
  uint32_t pair_ = 0;
};

// The runs of one block, appended to out: the block, or one layer of it (its num_outer
// chunks, one run where both sides are contiguous: a compact block holds a layer's chunks
// back to back).
void append_segments(const Geometry &g, const BlockCopy &c, std::vector<Segment> &out);
void append_layer_segments(const Geometry &g, const BlockCopy &c, uint32_t layer,
                           std::vector<Segment> &out);

}  // namespace kvt
