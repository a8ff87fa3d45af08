// Copies between host-visible blocks, run by run (copy/segments.hpp), split across the worker
// pool when large.
#pragma once

#include <cstdint>
#include <vector>

#include "copy/segments.hpp"
#include "copy/worker_pool.hpp"

namespace kvt {

void copy_segments(const std::vector<Segment> &segs, WorkerPool &pool);
void copy_blocks(const Geometry &g, const std::vector<BlockCopy> &copies, WorkerPool &pool);

}  // namespace kvt
