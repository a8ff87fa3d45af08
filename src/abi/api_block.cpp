// Blocks: allocation, references, lifecycle, registration, prefix match, data access,
// priorities and pins.
#include <mutex>
#include <vector>

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

// A pin, unpin or priority change over blocks of any tiers, all or nothing: it takes every
// involved tier's lock in tier order (as release does), checks that every block is
// registered, and only then calls change(tiers, blocks) with each block's tier and slot.
struct Marked {
  Tier *tier;
  uint32_t slot;
};

template <class Change>
kvt_status change_marks(const char *fn, kvt_manager *m, const kvt_block *blocks, size_t n,
                        Change &&change) noexcept {
  return on_manager(fn, m, [&](Manager &mgr) {
    if (kvt_status s = check_array(fn, "blocks", blocks, n); s != KVT_OK) return s;
    std::vector<Marked> marked(n);
    Tier *tiers[4] = {};
    for (size_t i = 0; i < n; ++i) {
      if ((marked[i].tier = mgr.tier_of(blocks[i])) == nullptr) return KVT_ERR_INVALID_HANDLE;
      tiers[marked[i].tier->id()] = marked[i].tier;
    }
    std::unique_lock<std::mutex> locks[4];
    for (int t = KVT_TIER_G1; t <= KVT_TIER_G3; ++t)
      if (tiers[t]) locks[t] = std::unique_lock(tiers[t]->lock());
    for (size_t i = 0; i < n; ++i)
      if (kvt_status s = marked[i].tier->registered_locked(blocks[i], fn, i, &marked[i].slot);
          s != KVT_OK)
        return s;
    return change(tiers, marked);
  });
}

}  // namespace

extern "C" {

KVT_API kvt_status kvt_block_set_priority(kvt_manager *m, const kvt_block *blocks, size_t n,
                                          int32_t priority) {
  return change_marks("kvt_block_set_priority", m, blocks, n,
                      [&](Tier *const *tiers, const std::vector<Marked> &marked) {
    uint64_t count[4] = {};
    for (const Marked &k : marked) ++count[k.tier->id()];
    try {  // reserves what the changes need: nothing can fail after it
      for (int t = KVT_TIER_G1; t <= KVT_TIER_G3; ++t)
        if (tiers[t]) tiers[t]->evictor_locked().prepare_priority(priority, count[t]);
    } catch (...) {
      for (int t = KVT_TIER_G1; t <= KVT_TIER_G3; ++t)
        if (tiers[t]) tiers[t]->evictor_locked().unprepare_priority(priority);
      throw;
    }
    for (const Marked &k : marked) k.tier->evictor_locked().set_priority(k.slot, priority);
    return KVT_OK;
  });
}

KVT_API kvt_status kvt_block_pin(kvt_manager *m, const kvt_block *blocks, size_t n) {
  return change_marks("kvt_block_pin", m, blocks, n,
                      [&](Tier *const *tiers, const std::vector<Marked> &marked) {
    for (int t = KVT_TIER_G1; t <= KVT_TIER_G3; ++t)
      if (tiers[t]) tiers[t]->evictor_locked().prepare_marks();
    uint64_t staged[4] = {};
    for (const Marked &k : marked)
      if (k.tier->evictor_locked().stage_pin(k.slot)) ++staged[k.tier->id()];
    for (int t = KVT_TIER_G1; t <= KVT_TIER_G3; ++t) {
      if (!tiers[t]) continue;
      if (kvt_status s = tiers[t]->evictor_locked().admit_pins(staged[t]); s != KVT_OK) {
        for (const Marked &k : marked) k.tier->evictor_locked().unstage_pin(k.slot);
        return s;
      }
    }
    for (const Marked &k : marked) k.tier->evictor_locked().commit_pin(k.slot);
    return KVT_OK;
  });
}

KVT_API kvt_status kvt_block_unpin(kvt_manager *m, const kvt_block *blocks, size_t n) {
  return change_marks("kvt_block_unpin", m, blocks, n,
                      [&](Tier *const *, const std::vector<Marked> &marked) {
    for (const Marked &k : marked) k.tier->evictor_locked().unpin(k.slot);
    return KVT_OK;
  });
}

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

KVT_API kvt_status kvt_tier_match_prefix(size_t *out_n, kvt_block *out_blocks, kvt_manager *m,
                                         kvt_tier tier, const uint64_t *seq_hashes, size_t n) {
  static constexpr const char *fn = "kvt_tier_match_prefix";
  return on_manager(fn, m, [&](Manager &mgr) {
    if (out_n == nullptr) return null_arg(fn, "out_n");
    if (kvt_status s = check_array(fn, "out_blocks", out_blocks, n); s != KVT_OK) return s;
    if (kvt_status s = check_array(fn, "seq_hashes", seq_hashes, n); s != KVT_OK) return s;
    Tier *t = mgr.tier(tier_number(tier));
    return t ? t->match(out_n, out_blocks, seq_hashes, n) : KVT_ERR_INVALID_ARGUMENT;
  });
}

KVT_API kvt_status kvt_tier_evictable_blocks(kvt_block *out, size_t cap, size_t *n,
                                             kvt_manager *m, kvt_tier tier) {
  static constexpr const char *fn = "kvt_tier_evictable_blocks";
  return on_manager(fn, m, [&](Manager &mgr) {
    if (n == nullptr) return null_arg(fn, "n");
    if (kvt_status s = check_array(fn, "out", out, cap); s != KVT_OK) return s;
    Tier *t = mgr.tier(tier_number(tier));
    return t ? t->evictable(out, cap, n) : KVT_ERR_INVALID_ARGUMENT;
  });
}

}  // extern "C"
