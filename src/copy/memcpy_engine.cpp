#include "copy/memcpy_engine.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace kvt {

namespace {
// Below this a copy is not worth waking other threads for.
constexpr size_t kSplitBytes = size_t{1} << 20;
// Copies with non-temporal stores where the copy is large: the destination is a block in a
// lower tier (or a device-bound one), which nobody reads soon, so filling caches with it, and
// reading it in first to do so, only halves the bandwidth.
void copy(char *dst, const char *src, size_t len) {
#if defined(__SSE2__)
  constexpr size_t kStreamBytes = 16 << 10;
  if (len >= kStreamBytes) {
    size_t head = (16 - reinterpret_cast<uintptr_t>(dst) % 16) % 16;
    std::memcpy(dst, src, head);
    dst += head;
    src += head;
    len -= head;
    size_t i = 0;
    for (; i + 64 <= len; i += 64) {
      __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i *>(src + i));
      __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i *>(src + i + 16));
      __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i *>(src + i + 32));
      __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i *>(src + i + 48));
      _mm_stream_si128(reinterpret_cast<__m128i *>(dst + i), a);
      _mm_stream_si128(reinterpret_cast<__m128i *>(dst + i + 16), b);
      _mm_stream_si128(reinterpret_cast<__m128i *>(dst + i + 32), c);
      _mm_stream_si128(reinterpret_cast<__m128i *>(dst + i + 48), d);
    }
    std::memcpy(dst + i, src + i, len - i);
    _mm_sfence();  // the stores are visible before the transfer is reported done
    return;
  }
#endif
  std::memcpy(dst, src, len);
}

}  // namespace

void copy_segments(const std::vector<Segment> &segs, WorkerPool &pool) {
  size_t total = 0;
  for (const Segment &s : segs) total += s.len;
  const size_t parts = std::min<size_t>(pool.threads() + 1, std::max<size_t>(1, total / kSplitBytes));
  if (parts <= 1) {
    for (const Segment &s : segs) copy(s.dst, s.src, s.len);
    return;
  }
  // Each part copies an equal share of the bytes, cutting segments where needed.
  const size_t share = (total + parts - 1) / parts;
  pool.parallel_for(parts, [&](size_t p) {
    size_t begin = p * share, end = std::min(total, begin + share), at = 0;
    for (const Segment &s : segs) {
      size_t lo = std::max(begin, at), hi = std::min(end, at + s.len);
      if (lo < hi) copy(s.dst + (lo - at), s.src + (lo - at), hi - lo);
      at += s.len;
      if (at >= end) break;
    }
  });
}

void copy_blocks(const Geometry &g, const std::vector<BlockCopy> &copies, WorkerPool &pool) {
  if (g.block_bytes() == 0) return;  // metadata-only tiers: not even a pass over the copies
  std::vector<Segment> segs;
  for (const BlockCopy &c : copies) append_segments(g, c, segs);
  copy_segments(segs, pool);
}

}  // namespace kvt
