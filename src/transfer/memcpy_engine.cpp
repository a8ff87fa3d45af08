#include "transfer/memcpy_engine.hpp"

#include <algorithm>
#include <cstring>

namespace kvt {

namespace {
// Below this a copy is not worth waking other threads for.
constexpr size_t kSplitBytes = size_t{1} << 20;
char *block_ptr(const BlockRef &r) {
  return r.buf ? static_cast<char *>(r.buf) : static_cast<char *>(r.mem->block(r.slot));
}

char *chunk_ptr(const Geometry &g, const BlockRef &r, uint32_t l, uint32_t o) {
  if (r.buf) return static_cast<char *>(r.buf) + (uint64_t{l} * g.num_outer + o) * g.chunk_bytes;
  return static_cast<char *>(r.mem->chunk(r.slot, l, o));
}
}  // namespace

void append_segments(const Geometry &g, const BlockCopy &c, std::vector<Segment> &out) {
  if (g.block_bytes() == 0) return;
  char *d = block_ptr(c.dst), *s = block_ptr(c.src);
  if (d != nullptr && s != nullptr) {
    out.push_back({d, s, g.block_bytes()});
    return;
  }
  for (uint32_t l = 0; l < g.num_layers; ++l)
    for (uint32_t o = 0; o < g.num_outer; ++o)
      out.push_back({chunk_ptr(g, c.dst, l, o), chunk_ptr(g, c.src, l, o), g.chunk_bytes});
}

void copy_blocks(const Geometry &g, const std::vector<BlockCopy> &copies, WorkerPool &pool) {
  const size_t block_bytes = g.block_bytes();
  if (block_bytes == 0) return;
  std::vector<Segment> segs;
  for (const BlockCopy &c : copies) append_segments(g, c, segs);
  const size_t total = block_bytes * copies.size();
  const size_t parts = std::min<size_t>(pool.threads() + 1, std::max<size_t>(1, total / kSplitBytes));
  if (parts <= 1) {
    for (const Segment &s : segs) std::memcpy(s.dst, s.src, s.len);
    return;
  }
  // Each part copies an equal share of the bytes, cutting segments where needed.
  const size_t share = (total + parts - 1) / parts;
  pool.parallel_for(parts, [&](size_t p) {
    size_t begin = p * share, end = std::min(total, begin + share), at = 0;
    for (const Segment &s : segs) {
      size_t lo = std::max(begin, at), hi = std::min(end, at + s.len);
      if (lo < hi) std::memcpy(s.dst + (lo - at), s.src + (lo - at), hi - lo);
      at += s.len;
      if (at >= end) break;
    }
  });
}

}  // namespace kvt
