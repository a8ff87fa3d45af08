// Transfers and fences: kvt_xfer_offload, kvt_xfer_onboard, kvt_xfer_*, kvt_fence_*. The handles
// are tokens (abi/xfer_table.hpp); each call looks its object up and keeps it alive while it runs.
#include "abi/guard.hpp"
#include "abi/objects.hpp"
#include "abi/xfer_table.hpp"
#include "memory/cuda.hpp"
#include "pipeline/pipeline.hpp"

using namespace kvt;
using namespace kvt::abi;

namespace {

kvt_xfer *xfer_handle(uint64_t token) { return reinterpret_cast<kvt_xfer *>(uintptr_t(token)); }
kvt_fence *fence_handle(uint64_t token) {
  return reinterpret_cast<kvt_fence *>(uintptr_t(token));
}

// Runs op on a live transfer, inside guard().
template <class Op>
kvt_status on_xfer(const char *fn, kvt_xfer *x, Op &&op) noexcept {
  return guard(fn, [&] {
    std::shared_ptr<Transfer> t = x ? transfers().find(token(x)) : nullptr;
    return t ? op(*t->pipe, *t) : bad_object(fn, x, "transfer");
  });
}

kvt_status new_fence(kvt_fence **out, Pipeline &p, void *cuda_event) {
  std::shared_ptr<Fence> f;
  if (kvt_status s = p.fence_create(&f, cuda_event); s != KVT_OK) return s;
  *out = fence_handle(fences().insert(std::move(f), &p));
  return KVT_OK;
}

}  // namespace

namespace kvt::abi {

kvt_status precondition_of(const char *fn, kvt_fence *f, std::shared_ptr<Fence> *out) {
  if (f == nullptr) return KVT_OK;
  *out = fences().find(token(f));
  if (*out == nullptr)
    return fail(KVT_ERR_INVALID_HANDLE, "%s: the precondition %p is not a live fence", fn,
                static_cast<void *>(f));
  return KVT_OK;
}

kvt_status start(kvt_xfer **out, Pipeline &p, const std::shared_ptr<Transfer> &t,
                 const std::shared_ptr<Fence> &f) {
  uint64_t tok = transfers().insert(t, &p);
  t->token = tok;
  if (kvt_status s = p.enqueue(t, f); s != KVT_OK) {
    transfers().take(tok);
    return s;
  }
  *out = xfer_handle(tok);
  return KVT_OK;
}

}  // namespace kvt::abi

extern "C" {

KVT_API kvt_status kvt_fence_create(kvt_fence **out, kvt_manager *m) {
  static constexpr const char *fn = "kvt_fence_create";
  return on_manager(fn, m, [&](Manager &mgr) {
    if (out == nullptr) return null_arg(fn, "out");
    return new_fence(out, mgr.pipeline(), nullptr);
  });
}

KVT_API kvt_status kvt_fence_from_cuda_event(kvt_fence **out, kvt_manager *m, void *cuda_event) {
  static constexpr const char *fn = "kvt_fence_from_cuda_event";
  return on_manager(fn, m, [&](Manager &mgr) {
    if (out == nullptr) return null_arg(fn, "out");
    if (cuda_event == nullptr) return null_arg(fn, "cuda_event");
    if (!cuda::available())
      return fail(KVT_ERR_UNSUPPORTED, "%s: this kvtier was built without CUDA", fn);
    return new_fence(out, mgr.pipeline(), cuda_event);
  });
}

KVT_API kvt_status kvt_fence_signal(kvt_fence *f) {
  static constexpr const char *fn = "kvt_fence_signal";
  return guard(fn, [&] {
    std::shared_ptr<Fence> fence = f ? fences().find(token(f)) : nullptr;
    if (!fence) return bad_object(fn, f, "fence");
    if (fence->cuda_event != nullptr)
      return fail(KVT_ERR_STATE, "%s: a CUDA-event fence is signalled by its event", fn);
    return fence->pipe->fence_signal(*fence);
  });
}

KVT_API void kvt_fence_destroy(kvt_fence *f) {
  guard("kvt_fence_destroy", [&] {
    if (std::shared_ptr<Fence> fence = f ? fences().take(token(f)) : nullptr)
      fence->pipe->fence_destroy(*fence);
    return KVT_OK;
  });
}

KVT_API kvt_status kvt_xfer_offload(kvt_xfer **out, kvt_manager *m, const kvt_block *src, size_t n,
                                    kvt_tier dst, kvt_fence *precondition, uint64_t user_data) {
  static constexpr const char *fn = "kvt_xfer_offload";
  return on_manager(fn, m, [&](Manager &mgr) {
    if (out == nullptr) return null_arg(fn, "out");
    if (kvt_status s = check_array(fn, "src", src, n); s != KVT_OK) return s;
    std::shared_ptr<Fence> f;
    if (kvt_status s = precondition_of(fn, precondition, &f); s != KVT_OK) return s;
    std::shared_ptr<Transfer> t;
    Pipeline &p = mgr.pipeline();
    if (kvt_status s = p.offload(&t, src, n, tier_number(dst), user_data); s != KVT_OK)
      return s;
    return start(out, p, t, f);
  });
}

KVT_API kvt_status kvt_xfer_onboard(kvt_xfer **out, kvt_manager *m, const kvt_block *src,
                                    const kvt_block *dst_g1, size_t n, kvt_fence *precondition,
                                    uint64_t user_data) {
  static constexpr const char *fn = "kvt_xfer_onboard";
  return on_manager(fn, m, [&](Manager &mgr) {
    if (out == nullptr) return null_arg(fn, "out");
    if (kvt_status s = check_array(fn, "src", src, n); s != KVT_OK) return s;
    if (kvt_status s = check_array(fn, "dst_g1", dst_g1, n); s != KVT_OK) return s;
    std::shared_ptr<Fence> f;
    if (kvt_status s = precondition_of(fn, precondition, &f); s != KVT_OK) return s;
    std::shared_ptr<Transfer> t;
    Pipeline &p = mgr.pipeline();
    if (kvt_status s = p.onboard(&t, src, dst_g1, n, user_data); s != KVT_OK) return s;
    return start(out, p, t, f);
  });
}

KVT_API kvt_status kvt_xfer_cancel(kvt_xfer *x) {
  return on_xfer("kvt_xfer_cancel", x, [&](Pipeline &p, Transfer &t) { return p.cancel(t); });
}

KVT_API kvt_status kvt_xfer_wait(kvt_xfer *x, int64_t timeout_ns) {
  return on_xfer("kvt_xfer_wait", x,
                 [&](Pipeline &p, Transfer &t) { return p.wait(t, timeout_ns); });
}

KVT_API kvt_status kvt_xfer_status(uint32_t *out_state, kvt_status *out_result,
                                   uint64_t *out_count, kvt_xfer *x) {
  return on_xfer("kvt_xfer_status", x, [&](Pipeline &p, Transfer &t) {
    return p.status(out_state, out_result, out_count, t);
  });
}

KVT_API kvt_status kvt_xfer_blocks(kvt_block *out, size_t n, kvt_xfer *x) {
  static constexpr const char *fn = "kvt_xfer_blocks";
  return on_xfer(fn, x, [&](Pipeline &p, Transfer &t) {
    kvt_status s = check_array(fn, "out", out, n);
    return s == KVT_OK ? p.blocks(out, n, t) : s;
  });
}

KVT_API void kvt_xfer_release(kvt_xfer *x) {
  guard("kvt_xfer_release", [&] {
    if (std::shared_ptr<Transfer> t = x ? transfers().take(token(x)) : nullptr)
      t->pipe->release(*t);
    return KVT_OK;
  });
}

}  // extern "C"
