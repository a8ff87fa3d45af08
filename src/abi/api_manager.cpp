// Manager lifetime, statistics and events.
// Without the header's inline kvt_manager_config_init: this file exports 0.1.0's function of
// that name, which programs built against the 0.1.0 header still call.
#define KVT_NO_INLINE
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "abi/guard.hpp"
#include "abi/objects.hpp"
#include "abi/xfer_table.hpp"
#include "common/versioned.hpp"
#include "manager/config.hpp"

using namespace kvt;
using namespace kvt::abi;

extern "C" {

KVT_API void kvt_manager_config_init_sized(kvt_manager_config *cfg, size_t size) {
  if (cfg == nullptr) return;
  if (check_struct_size<kvt_manager_config>("kvt_manager_config_init_sized", "cfg", size) !=
      KVT_OK) {
    // Write nothing past the caller's size; the size alone makes kvt_manager_create refuse it.
    if (size >= sizeof cfg->struct_size)
      cfg->struct_size = uint32_t(std::min<size_t>(size, UINT32_MAX));
    return;
  }
  kvt_manager_config full;
  config_defaults(&full);
  full.struct_size = uint32_t(size);
  std::memcpy(static_cast<void *>(cfg), &full, size);
}

// 0.1.0's init, for binaries built against that header: their struct is 0.1.0's size.
KVT_API void kvt_manager_config_init(kvt_manager_config *cfg);
KVT_API void kvt_manager_config_init(kvt_manager_config *cfg) {
  kvt_manager_config_init_sized(cfg, Versioned<kvt_manager_config>::first);
}

KVT_API kvt_status kvt_manager_create(kvt_manager **out, const kvt_manager_config *cfg) {
  static constexpr const char *fn = "kvt_manager_create";
  return guard(fn, [&] {
    if (out == nullptr) return null_arg(fn, "out");
    if (cfg == nullptr) return null_arg(fn, "cfg");
    kvt_manager_config c;
    config_defaults(&c);
    if (kvt_status s = read_versioned(&c, *cfg, fn, "cfg"); s != KVT_OK) return s;
    kvt_g1_layout layout{};
    if (c.g1_layout != nullptr) {
      if (kvt_status s = read_versioned(&layout, *c.g1_layout, fn, "cfg->g1_layout");
          s != KVT_OK)
        return s;
      c.g1_layout = &layout;
    }
    auto m = std::make_unique<kvt_manager>();
    if (kvt_status s = Manager::create(&m->impl, c); s != KVT_OK) return s;
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

KVT_API kvt_status kvt_manager_reset(kvt_manager *m, int tier) {
  static constexpr const char *fn = "kvt_manager_reset";
  return on_manager(fn, m, [&](Manager &mgr) {
    if (tier == KVT_TIER_G4)
      return fail(KVT_ERR_INVALID_ARGUMENT,
                  "%s: G4 (4) is Redis's to empty (FLUSHDB, or let maxmemory evict): kvtier "
                  "keeps no registry of it", fn);
    if (tier < 0 || tier > KVT_TIER_G3)
      return fail(KVT_ERR_INVALID_ARGUMENT,
                  "%s: tier %d is neither 0 (every tier) nor KVT_TIER_G1..G3 (1..3)", fn, tier);
    return mgr.reset(tier);
  });
}

KVT_API kvt_status kvt_tier_stats_get(kvt_tier_stats *out, kvt_manager *m, kvt_tier tier) {
  static constexpr const char *fn = "kvt_tier_stats_get";
  return on_manager(fn, m, [&](Manager &mgr) {
    if (out == nullptr) return null_arg(fn, "out");
    if (kvt_status s = check_struct_size<kvt_tier_stats>(fn, "out", out->struct_size);
        s != KVT_OK)
      return s;
    int tn = tier_number(tier);
    if (tn == KVT_TIER_G4)
      return fail(KVT_ERR_INVALID_ARGUMENT,
                  "%s: G4 (4) has no blocks of its own: its counters are kvt_g4_stats_get's", fn);
    if (tn < KVT_TIER_G1 || tn > KVT_TIER_G3)
      return fail(KVT_ERR_INVALID_ARGUMENT, "%s: tier %d is not a tier", fn, tn);
    kvt_tier_stats r{};
    if (Tier *t = mgr.tier_if_present(tn)) {
      t->stats(&r);
      r.block_bytes = mgr.block_bytes();
    }
    write_versioned(out, r);
    return KVT_OK;
  });
}

KVT_API kvt_status kvt_tier_hashes(uint64_t *out, size_t cap, size_t *n, kvt_manager *m,
                                   kvt_tier tier) {
  static constexpr const char *fn = "kvt_tier_hashes";
  return on_manager(fn, m, [&](Manager &mgr) {
    if (n == nullptr) return null_arg(fn, "n");
    if (kvt_status s = check_array(fn, "out", out, cap); s != KVT_OK) return s;
    Tier *t = mgr.tier(tier_number(tier));
    if (t == nullptr)
      return fail(KVT_ERR_INVALID_ARGUMENT, "%s: %s", fn, std::string(kvt_last_error()).c_str());
    std::vector<uint64_t> h = t->hashes();
    std::copy_n(h.begin(), std::min(cap, h.size()), out);
    *n = h.size();
    return KVT_OK;
  });
}

KVT_API kvt_status kvt_transfer_stats_get(kvt_transfer_stats *out, kvt_manager *m,
                                          kvt_tier src, kvt_tier dst) {
  static constexpr const char *fn = "kvt_transfer_stats_get";
  return on_manager(fn, m, [&](Manager &mgr) {
    if (out == nullptr) return null_arg(fn, "out");
    if (kvt_status s = check_struct_size<kvt_transfer_stats>(fn, "out", out->struct_size);
        s != KVT_OK)
      return s;
    kvt_transfer_stats r{};
    if (kvt_status s = mgr.pipeline().transfer_stats(&r, tier_number(src), tier_number(dst));
        s != KVT_OK)
      return s;
    write_versioned(out, r);
    return KVT_OK;
  });
}

KVT_API size_t kvt_manager_poll(kvt_manager *m, kvt_event *out, size_t max) {
  static constexpr const char *fn = "kvt_manager_poll";
  size_t n = 0;
  on_manager(fn, m, [&](Manager &mgr) {
    if (kvt_status s = check_array(fn, "out", out, max); s != KVT_OK) return s;
    n = mgr.events().poll(out, max);
    return KVT_OK;
  });
  return n;
}

KVT_API int kvt_manager_event_fd(kvt_manager *m) {
  kvt_status st;
  Manager *mgr = manager("kvt_manager_event_fd", m, &st);
  return mgr ? mgr->events().fd() : -1;
}

}  // extern "C"
