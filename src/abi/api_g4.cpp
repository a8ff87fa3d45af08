// G4, the remote tier on Redis: kvt_g4_match, kvt_g4_onboard, kvt_g4_stats_get. Offload to
// G4 is kvt_xfer_offload's (api_xfer.cpp); onboards run through the pipeline like kvt_xfer_onboard.
#include "abi/guard.hpp"
#include "abi/objects.hpp"
#include "abi/xfer_table.hpp"
#include "common/versioned.hpp"
#include "pipeline/pipeline.hpp"
#include "remote/store.hpp"

using namespace kvt;
using namespace kvt::abi;

namespace {
kvt_status no_g4(const char *fn) {
  return fail(KVT_ERR_UNSUPPORTED, "%s: this manager has no G4 (g4_url is NULL)", fn);
}
}  // namespace

extern "C" {

KVT_API kvt_status kvt_g4_match(size_t *out_n, kvt_manager *m, const uint64_t *seq_hashes,
                                size_t n) {
  static constexpr const char *fn = "kvt_g4_match";
  return on_manager(fn, m, [&](Manager &mgr) {
    if (out_n == nullptr) return null_arg(fn, "out_n");
    if (kvt_status s = check_array(fn, "seq_hashes", seq_hashes, n); s != KVT_OK) return s;
    remote::Store *g4 = mgr.g4();
    if (g4 == nullptr) return no_g4(fn);
    size_t found = 0;
    kvt_status s = n == 0 ? KVT_OK : g4->exists_prefix(&found, seq_hashes, n);
    *out_n = s == KVT_OK ? found : 0;  // the header promises 0 with KVT_ERR_IO
    return s;
  });
}

KVT_API kvt_status kvt_g4_onboard(kvt_xfer **out, kvt_manager *m, const uint64_t *seq_hashes,
                                  size_t n, uint64_t parent_seq_hash, const kvt_block *dst,
                                  kvt_fence *precondition, uint64_t user_data) {
  static constexpr const char *fn = "kvt_g4_onboard";
  return on_manager(fn, m, [&](Manager &mgr) {
    if (out == nullptr) return null_arg(fn, "out");
    if (kvt_status s = check_array(fn, "seq_hashes", seq_hashes, n); s != KVT_OK) return s;
    if (kvt_status s = check_array(fn, "dst", dst, n); s != KVT_OK) return s;
    if (mgr.g4() == nullptr) return no_g4(fn);
    std::shared_ptr<Fence> f;
    if (kvt_status s = precondition_of(fn, precondition, &f); s != KVT_OK) return s;
    std::shared_ptr<Transfer> t;
    Pipeline &p = mgr.pipeline();
    if (kvt_status s = p.g4_onboard(&t, seq_hashes, n, parent_seq_hash, dst, user_data);
        s != KVT_OK)
      return s;
    return start(out, p, t, f);
  });
}

KVT_API kvt_status kvt_g4_stats_get(kvt_g4_stats *out, kvt_manager *m) {
  static constexpr const char *fn = "kvt_g4_stats_get";
  return on_manager(fn, m, [&](Manager &mgr) {
    if (out == nullptr) return null_arg(fn, "out");
    if (kvt_status s = check_struct_size<kvt_g4_stats>(fn, "out", out->struct_size);
        s != KVT_OK)
      return s;
    remote::Store *g4 = mgr.g4();
    if (g4 == nullptr) return no_g4(fn);
    kvt_g4_stats r{};
    g4->stats(&r);
    write_versioned(out, r);
    return KVT_OK;
  });
}

}  // extern "C"
