#include "copy/copy_set.hpp"

#include <string>
#include <utility>

#include "common/error.hpp"
#include "copy/cuda_engine.hpp"

namespace kvt {

namespace {
bool on_device(const BlockRef &r) { return r.mem != nullptr && !r.mem->host_visible(); }
}  // namespace

CopySet::Device *CopySet::device_of(const BlockCopy &c) {
  if (on_device(c.dst)) return &h2d_;
  if (on_device(c.src)) return &d2h_;
  return nullptr;
}

void CopySet::add(const BlockCopy &c, size_t owner) {
  Device *d = device_of(c);
  if (d == nullptr) return host_blocks_.push_back(c);
  d->parts.push_back({c, SegmentCursor::kWholeBlock});
  d->owner.push_back(owner);
}

void CopySet::add_layer(const BlockCopy &c, uint32_t layer, size_t owner) {
  Device *d = device_of(c);
  if (d == nullptr) return append_layer_segments(g_, c, layer, host_segs_);
  d->parts.push_back({c, layer});
  d->owner.push_back(owner);
}

bool CopySet::empty() const noexcept {
  return host_blocks_.empty() && host_segs_.empty() && h2d_.parts.empty() && d2h_.parts.empty();
}

std::vector<CopySet::Failure> CopySet::run(CudaEngine *cuda, WorkerPool &pool) const {
  if (!host_blocks_.empty()) copy_blocks(g_, host_blocks_, pool);
  if (!host_segs_.empty()) copy_segments(host_segs_, pool);
  std::vector<Failure> failed;
  for (auto [d, to_device] : {std::pair{&h2d_, true}, std::pair{&d2h_, false}}) {
    SegmentCursor segs(g_, d->parts);
    if (segs.size() == 0) continue;
    const kvt_status st = cuda ? cuda->copy(segs, to_device)
                               : fail(KVT_ERR_UNSUPPORTED, "no CUDA copy engine for CUDA memory");
    if (st == KVT_OK) continue;
    const std::string why = last_error();
    for (size_t o : d->owner) failed.push_back({o, st, why});
  }
  return failed;
}

}  // namespace kvt
