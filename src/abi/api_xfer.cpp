// Transfers and fences: kvt_offload, kvt_onboard, kvt_xfer_*, kvt_fence_*.
#include "abi/guard.hpp"
#include "abi/objects.hpp"
#include "memory/cuda.hpp"
#include "pipeline/pipeline.hpp"

using namespace kvt;
using namespace kvt::abi;

namespace {

Pipeline *live_xfer(const char *fn, kvt_xfer *x, kvt_status *st) {
  if (x == nullptr || x->magic != kvt_xfer::kMagic) {
    *st = bad_object(fn, x, "transfer");
    return nullptr;
  }
  *st = KVT_OK;
  return x->pipe;
}

// Runs op on the pipeline of a live transfer, inside guard().
template <class Op>
kvt_status on_xfer(const char *fn, kvt_xfer *x, Op &&op) noexcept {
  return guard(fn, [&] {
    kvt_status st;
    Pipeline *p = live_xfer(fn, x, &st);
    return p ? op(*p) : st;
  });
}

Pipeline *live_fence(const char *fn, kvt_fence *f, kvt_status *st) {
  if (f == nullptr || f->magic != kvt_fence::kMagic) {
    *st = bad_object(fn, f, "fence");
    return nullptr;
  }
  *st = KVT_OK;
  return f->pipe;
}

}  // namespace

extern "C" {

KVT_API kvt_status kvt_fence_create(kvt_fence **out, kvt_manager *m) {
  static constexpr const char *fn = "kvt_fence_create";
  return on_manager(fn, m, [&](Manager &mgr) {
    if (out == nullptr) return null_arg(fn, "out");
    return mgr.pipeline().fence_create(out, nullptr);
  });
}

KVT_API kvt_status kvt_fence_from_cuda_event(kvt_fence **out, kvt_manager *m, void *cuda_event) {
  static constexpr const char *fn = "kvt_fence_from_cuda_event";
  return on_manager(fn, m, [&](Manager &mgr) {
    if (out == nullptr) return null_arg(fn, "out");
    if (cuda_event == nullptr) return null_arg(fn, "cuda_event");
    if (!cuda::available())
      return fail(KVT_ERR_UNSUPPORTED, "%s: this kvtier was built without CUDA", fn);
    return mgr.pipeline().fence_create(out, cuda_event);
  });
}

KVT_API kvt_status kvt_fence_signal(kvt_fence *f) {
  static constexpr const char *fn = "kvt_fence_signal";
  return guard(fn, [&] {
    kvt_status st;
    Pipeline *p = live_fence(fn, f, &st);
    if (!p) return st;
    if (f->cuda_event != nullptr)
      return fail(KVT_ERR_STATE, "%s: a CUDA-event fence is signalled by its event", fn);
    return p->fence_signal(f);
  });
}

KVT_API void kvt_fence_destroy(kvt_fence *f) {
  kvt_status st;
  if (Pipeline *p = live_fence("kvt_fence_destroy", f, &st)) {
    guard("kvt_fence_destroy", [&] {
      p->fence_destroy(f);
      return KVT_OK;
    });
  }
}

KVT_API kvt_status kvt_offload(kvt_xfer **out, kvt_manager *m, const kvt_block *src, size_t n,
                               kvt_tier dst, kvt_fence *precondition, uint64_t user_data) {
  static constexpr const char *fn = "kvt_offload";
  return on_manager(fn, m, [&](Manager &mgr) {
    if (out == nullptr) return null_arg(fn, "out");
    if (kvt_status s = check_array(fn, "src", src, n); s != KVT_OK) return s;
    return mgr.pipeline().offload(out, src, n, tier_number(dst), precondition,
                                   user_data);
  });
}

KVT_API kvt_status kvt_onboard(kvt_xfer **out, kvt_manager *m, const kvt_block *src,
                               const kvt_block *dst_g1, size_t n, kvt_fence *precondition,
                               uint64_t user_data) {
  static constexpr const char *fn = "kvt_onboard";
  return on_manager(fn, m, [&](Manager &mgr) {
    if (out == nullptr) return null_arg(fn, "out");
    if (kvt_status s = check_array(fn, "src", src, n); s != KVT_OK) return s;
    if (kvt_status s = check_array(fn, "dst_g1", dst_g1, n); s != KVT_OK) return s;
    return mgr.pipeline().onboard(out, src, dst_g1, n, precondition, user_data);
  });
}

KVT_API kvt_status kvt_xfer_cancel(kvt_xfer *x) {
  return on_xfer("kvt_xfer_cancel", x, [&](Pipeline &p) { return p.cancel(x); });
}

KVT_API kvt_status kvt_xfer_wait(kvt_xfer *x, int64_t timeout_ns) {
  return on_xfer("kvt_xfer_wait", x, [&](Pipeline &p) { return p.wait(x, timeout_ns); });
}

KVT_API kvt_status kvt_xfer_status(uint32_t *out_state, kvt_status *out_result,
                                   uint64_t *out_count, kvt_xfer *x) {
  return on_xfer("kvt_xfer_status", x, [&](Pipeline &p) {
    return p.status(out_state, out_result, out_count, x);
  });
}

KVT_API kvt_status kvt_xfer_blocks(kvt_block *out, size_t n, kvt_xfer *x) {
  static constexpr const char *fn = "kvt_xfer_blocks";
  return on_xfer(fn, x, [&](Pipeline &p) {
    kvt_status s = check_array(fn, "out", out, n);
    return s == KVT_OK ? p.blocks(out, n, x) : s;
  });
}

KVT_API void kvt_xfer_release(kvt_xfer *x) {
  kvt_status st;
  if (Pipeline *p = live_xfer("kvt_xfer_release", x, &st)) {
    guard("kvt_xfer_release", [&] {
      p->release(x);
      return KVT_OK;
    });
  }
}

}  // extern "C"
