// Manager lifetime, statistics and events.
#include <cstring>

#include "abi/guard.hpp"
#include "abi/objects.hpp"
#include "abi/xfer_table.hpp"
#include "manager/config.hpp"

using namespace kvt;
using namespace kvt::abi;

extern "C" {

KVT_API void kvt_manager_config_init(kvt_manager_config *cfg) {
  if (cfg != nullptr) config_defaults(cfg);
}

KVT_API kvt_status kvt_manager_create(kvt_manager **out, const kvt_manager_config *cfg) {
  static constexpr const char *fn = "kvt_manager_create";
  return guard(fn, [&] {
    if (out == nullptr) return null_arg(fn, "out");
    if (cfg == nullptr) return null_arg(fn, "cfg");
    if (cfg->struct_size != sizeof(kvt_manager_config))
      return fail(KVT_ERR_INVALID_ARGUMENT,
                  "%s: cfg->struct_size is %u, this library expects %zu: call "
                  "kvt_manager_config_init first",
                  fn, cfg->struct_size, sizeof(kvt_manager_config));
    auto m = std::make_unique<kvt_manager>();
    if (kvt_status s = Manager::create(&m->impl, *cfg); s != KVT_OK) return s;
    *out = m.release();
    return KVT_OK;
  });
}

KVT_API void kvt_manager_destroy(kvt_manager *m) {
  if (m == nullptr || m->magic != kvt_manager::kMagic) return;
  m->magic = 0;
  forget_tokens_of(&m->impl->pipeline());
  delete m;
}

KVT_API kvt_status kvt_manager_check(kvt_manager *m) {
  static constexpr const char *fn = "kvt_manager_check";
  return on_manager(fn, m, [&](Manager &mgr) { return mgr.check(); });
}

KVT_API kvt_status kvt_tier_stats_get(kvt_tier_stats *out, kvt_manager *m, kvt_tier tier) {
  static constexpr const char *fn = "kvt_tier_stats_get";
  return on_manager(fn, m, [&](Manager &mgr) {
    if (out == nullptr) return null_arg(fn, "out");
    if (out->struct_size != sizeof(kvt_tier_stats))
      return fail(KVT_ERR_INVALID_ARGUMENT, "%s: out->struct_size is %u, expected %zu", fn,
                  out->struct_size, sizeof(kvt_tier_stats));
    int tn = tier_number(tier);
    if (tn < KVT_TIER_G1 || tn > KVT_TIER_G3)
      return fail(KVT_ERR_INVALID_ARGUMENT, "%s: tier %d is not a tier", fn, tn);
    kvt_tier_stats r{};
    r.struct_size = sizeof r;
    if (Tier *t = mgr.tier_if_present(tn)) {
      t->stats(&r);
      r.block_bytes = mgr.block_bytes();
    }
    *out = r;
    return KVT_OK;
  });
}

KVT_API kvt_status kvt_transfer_stats_get(kvt_transfer_stats *out, kvt_manager *m,
                                          kvt_tier src, kvt_tier dst) {
  static constexpr const char *fn = "kvt_transfer_stats_get";
  return on_manager(fn, m, [&](Manager &mgr) {
    if (out == nullptr) return null_arg(fn, "out");
    if (out->struct_size != sizeof(kvt_transfer_stats))
      return fail(KVT_ERR_INVALID_ARGUMENT, "%s: out->struct_size is %u, expected %zu", fn,
                  out->struct_size, sizeof(kvt_transfer_stats));
    return mgr.pipeline().transfer_stats(out, tier_number(src), tier_number(dst));
  });
}

KVT_API size_t kvt_poll(kvt_manager *m, kvt_event *out, size_t max) {
  static constexpr const char *fn = "kvt_poll";
  size_t n = 0;
  on_manager(fn, m, [&](Manager &mgr) {
    if (kvt_status s = check_array(fn, "out", out, max); s != KVT_OK) return s;
    n = mgr.events().poll(out, max);
    return KVT_OK;
  });
  return n;
}

KVT_API int kvt_event_fd(kvt_manager *m) {
  kvt_status st;
  Manager *mgr = manager("kvt_event_fd", m, &st);
  return mgr ? mgr->events().fd() : -1;
}

}  // extern "C"
