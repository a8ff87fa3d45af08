#include "copy/segments.hpp"

namespace kvt {

namespace {
char *block_ptr(const BlockRef &r) {
  return r.buf ? static_cast<char *>(r.buf) : static_cast<char *>(r.mem->block(r.slot));
}

char *chunk_ptr(const Geometry &g, const BlockRef &r, uint32_t l, uint32_t o) {
  if (r.buf) return static_cast<char *>(r.buf) + (uint64_t{l} * g.num_outer + o) * g.chunk_bytes;
  return static_cast<char *>(r.mem->chunk(r.slot, l, o));
}

// The (layer, outer) pairs a part covers, [first, end), and both blocks' bases where both
// are contiguous: the pairs are then one run.
struct Pairs {
  uint32_t first, end;
  char *dst, *src;
  bool whole() const { return dst != nullptr && src != nullptr; }
};
Pairs pairs_of(const Geometry &g, const SegmentCursor::Part &p) {
  char *d = block_ptr(p.copy.dst), *s = block_ptr(p.copy.src);
  if (p.layer == SegmentCursor::kWholeBlock) return {0, g.num_layers * g.num_outer, d, s};
  return {p.layer * g.num_outer, (p.layer + 1) * g.num_outer, d, s};
}
}  // namespace

SegmentCursor::SegmentCursor(const Geometry &g, std::span<const Part> parts)
    : g_(g), parts_(parts) {
  if (g.block_bytes() == 0) {
    part_ = parts.size();
    return;
  }
  for (const Part &p : parts) {
    const Pairs r = pairs_of(g, p);
    total_ += r.whole() ? 1 : r.end - r.first;
  }
}

size_t SegmentCursor::next(Segment *out, size_t cap) {
  size_t n = 0;
  while (n < cap && part_ < parts_.size()) {
    const Part &p = parts_[part_];
    const Pairs r = pairs_of(g_, p);
    if (r.whole()) {
      const uint64_t at = uint64_t{r.first} * g_.chunk_bytes;
      out[n++] = {r.dst + at, r.src + at, (r.end - r.first) * g_.chunk_bytes};
      ++part_;
      continue;
    }
    if (pair_ < r.first) pair_ = r.first;
    for (; pair_ < r.end && n < cap; ++pair_) {
      const uint32_t l = pair_ / g_.num_outer, o = pair_ % g_.num_outer;
      out[n++] = {chunk_ptr(g_, p.copy.dst, l, o), chunk_ptr(g_, p.copy.src, l, o), g_.chunk_bytes};
    }
    if (pair_ == r.end) {
      ++part_;
      pair_ = 0;
    }
  }
  return n;
}

namespace {
void append(const Geometry &g, const SegmentCursor::Part &p, std::vector<Segment> &out) {
  SegmentCursor c(g, {&p, 1});
  const size_t at = out.size();
  out.resize(at + c.size());
  c.next(out.data() + at, c.size());
}
}  // namespace

void append_segments(const Geometry &g, const BlockCopy &c, std::vector<Segment> &out) {
  append(g, {c, SegmentCursor::kWholeBlock}, out);
}

void append_layer_segments(const Geometry &g, const BlockCopy &c, uint32_t layer,
                           std::vector<Segment> &out) {
  append(g, {c, layer}, out);
}

}  // namespace kvt
