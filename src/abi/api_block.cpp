// Blocks: allocation, references, lifecycle, registration, prefix match, data access.
#include "abi/guard.hpp"
#include "abi/objects.hpp"
#include "common/versioned.hpp"

using namespace kvt;
using namespace kvt::abi;

namespace {

// Runs op on the tier that owns block b, after checking the manager.
template <class Op>
kvt_status on_block(const char *fn, kvt_manager *m, kvt_block b, Op &&op) noexcept {
  return on_manager(fn, m, [&](Manager &mgr) {
    Tier *t = mgr.tier_of(b);
    return t ? op(mgr, *t) : KVT_ERR_INVALID_HANDLE;
  });
}

}  // namespace

extern "C" {

KVT_API kvt_status kvt_block_alloc(kvt_block *out, size_t n, kvt_manager *m, kvt_tier tier) {
  static constexpr const char *fn = "kvt_block_alloc";
  return on_manager(fn, m, [&](Manager &mgr) {
    if (n == 0) return fail(KVT_ERR_INVALID_ARGUMENT, "%s: n is 0", fn);
    if (kvt_status s = check_array(fn, "out", out, n); s != KVT_OK) return s;
    Tier *t = mgr.tier(tier_number(tier));
    return t ? t->alloc(out, n) : KVT_ERR_INVALID_ARGUMENT;
  });
}

KVT_API kvt_status kvt_block_release(kvt_manager *m, const kvt_block *blocks, size_t n) {
  static constexpr const char *fn = "kvt_block_release";
  return on_manager(fn, m, [&](Manager &mgr) {
    if (kvt_status s = check_array(fn, "blocks", blocks, n); s != KVT_OK) return s;
    return mgr.release(blocks, n);
  });
}

KVT_API kvt_status kvt_block_retain(kvt_manager *m, kvt_block b) {
  return on_block("kvt_block_retain", m, b, [&](Manager &, Tier &t) { return t.retain(b); });
}

KVT_API kvt_status kvt_block_info_get(kvt_block_info *out, kvt_manager *m, kvt_block b) {
  static constexpr const char *fn = "kvt_block_info_get";
  return on_block(fn, m, b, [&](Manager &, Tier &t) {
    if (out == nullptr) return null_arg(fn, "out");
    if (kvt_status s = check_struct_size<kvt_block_info>(fn, "out", out->struct_size);
        s != KVT_OK)
      return s;
    kvt_block_info r{};
    if (kvt_status s = t.info(&r, b); s != KVT_OK) return s;
    write_versioned(out, r);
    return KVT_OK;
  });
}

KVT_API kvt_status kvt_block_data(void **out_ptr, size_t *out_len, kvt_manager *m,
                                  kvt_block b) {
  static constexpr const char *fn = "kvt_block_data";
  return on_block(fn, m, b, [&](Manager &mgr, Tier &t) {
    if (out_ptr == nullptr) return null_arg(fn, "out_ptr");
    if (out_len == nullptr) return null_arg(fn, "out_len");
    void *p = nullptr;
    if (kvt_status s = t.data(&p, b); s != KVT_OK) return s;
    *out_ptr = p;
    *out_len = mgr.block_bytes();
    return KVT_OK;
  });
}

KVT_API kvt_status kvt_block_chunk(void **out_ptr, kvt_manager *m, kvt_block b, uint32_t layer,
                                   uint32_t outer) {
  static constexpr const char *fn = "kvt_block_chunk";
  return on_block(fn, m, b, [&](Manager &mgr, Tier &t) {
    if (out_ptr == nullptr) return null_arg(fn, "out_ptr");
    const Geometry &g = mgr.geometry();
    if (layer >= g.num_layers || outer >= g.num_outer)
      return fail(KVT_ERR_INVALID_ARGUMENT, "%s: chunk (%u, %u) is outside %u layers x %u", fn,
                  layer, outer, g.num_layers, g.num_outer);
    return t.chunk(out_ptr, b, layer, outer);
  });
}

KVT_API kvt_status kvt_block_init(kvt_manager *m, kvt_block b, uint64_t salt_hash,
                                  uint64_t parent_seq_hash) {
  return on_block("kvt_block_init", m, b,
                  [&](Manager &, Tier &t) { return t.init(b, salt_hash, parent_seq_hash); });
}

KVT_API kvt_status kvt_block_append(kvt_manager *m, kvt_block b, const uint32_t *tokens,
                                    size_t n) {
  static constexpr const char *fn = "kvt_block_append";
  return on_block(fn, m, b, [&](Manager &, Tier &t) {
    if (kvt_status s = check_array(fn, "tokens", tokens, n); s != KVT_OK) return s;
    return t.append(b, tokens, n);
  });
}

KVT_API kvt_status kvt_block_schedule(kvt_manager *m, kvt_block b) {
  return on_block("kvt_block_schedule", m, b, [&](Manager &, Tier &t) { return t.schedule(b); });
}

KVT_API kvt_status kvt_block_unschedule(kvt_manager *m, kvt_block b) {
  return on_block("kvt_block_unschedule", m, b,
                  [&](Manager &, Tier &t) { return t.unschedule(b); });
}

KVT_API kvt_status kvt_block_compute_done(kvt_manager *m, kvt_block b) {
  return on_block("kvt_block_compute_done", m, b,
                  [&](Manager &, Tier &t) { return t.compute_done(b); });
}

KVT_API kvt_status kvt_block_register(kvt_block *out, kvt_manager *m, kvt_block b) {
  static constexpr const char *fn = "kvt_block_register";
  return on_block(fn, m, b, [&](Manager &, Tier &t) {
    return out ? t.register_tokens(out, b) : null_arg(fn, "out");
  });
}

KVT_API kvt_status kvt_block_register_hash(kvt_block *out, kvt_manager *m, kvt_block b,
                                           uint64_t seq_hash, uint64_t parent_seq_hash) {
  static constexpr const char *fn = "kvt_block_register_hash";
  return on_block(fn, m, b, [&](Manager &, Tier &t) {
    return out ? t.register_hash(out, b, seq_hash, parent_seq_hash) : null_arg(fn, "out");
  });
}

KVT_API kvt_status kvt_block_register_hashes(kvt_block *out, kvt_manager *m,
                                             const kvt_block *blocks,
                                             const uint64_t *seq_hashes, size_t n,
                                             uint64_t parent_seq_hash) {
  static constexpr const char *fn = "kvt_block_register_hashes";
  return on_manager(fn, m, [&](Manager &mgr) {
    if (kvt_status s = check_array(fn, "out", out, n); s != KVT_OK) return s;
    if (kvt_status s = check_array(fn, "blocks", blocks, n); s != KVT_OK) return s;
    if (kvt_status s = check_array(fn, "seq_hashes", seq_hashes, n); s != KVT_OK) return s;
    if (n == 0) return KVT_OK;
    Tier *t = mgr.tier_of(blocks[0]);
    return t ? t->register_chain(out, blocks, seq_hashes, n, parent_seq_hash)
             : KVT_ERR_INVALID_HANDLE;
  });
}

KVT_API kvt_status kvt_match_prefix(size_t *out_n, kvt_block *out_blocks, kvt_manager *m,
                                    kvt_tier tier, const uint64_t *seq_hashes, size_t n) {
  static constexpr const char *fn = "kvt_match_prefix";
  return on_manager(fn, m, [&](Manager &mgr) {
    if (out_n == nullptr) return null_arg(fn, "out_n");
    if (kvt_status s = check_array(fn, "out_blocks", out_blocks, n); s != KVT_OK) return s;
    if (kvt_status s = check_array(fn, "seq_hashes", seq_hashes, n); s != KVT_OK) return s;
    Tier *t = mgr.tier(tier_number(tier));
    return t ? t->match(out_n, out_blocks, seq_hashes, n) : KVT_ERR_INVALID_ARGUMENT;
  });
}

KVT_API kvt_status kvt_tier_evictable(size_t *out_n, kvt_block *out, size_t max,
                                      kvt_manager *m, kvt_tier tier) {
  static constexpr const char *fn = "kvt_tier_evictable";
  return on_manager(fn, m, [&](Manager &mgr) {
    if (out_n == nullptr) return null_arg(fn, "out_n");
    if (kvt_status s = check_array(fn, "out", out, max); s != KVT_OK) return s;
    Tier *t = mgr.tier(tier_number(tier));
    return t ? t->evictable(out_n, out, max) : KVT_ERR_INVALID_ARGUMENT;
  });
}

}  // extern "C"
