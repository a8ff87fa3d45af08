#include "manager/pipeline_tiers.hpp"

#include "manager/manager.hpp"

namespace kvt {

const Geometry &PipelineTiers::geometry() const { return m_.geometry(); }
EventQueue &PipelineTiers::events() { return m_.events(); }
ObsSink &PipelineTiers::obs() { return m_.bus(); }

const TierMemory *PipelineTiers::memory(kvt_tier t) {
  Tier *tier = m_.tier_if_present(t);
  return tier && tier->memory().has_bytes() ? &tier->memory() : nullptr;
}

kvt_status PipelineTiers::present(int t) {
  return m_.tier(t) ? KVT_OK : KVT_ERR_INVALID_ARGUMENT;
}

kvt_status PipelineTiers::tier_of(kvt_block b, kvt_tier *out) {
  Tier *t = m_.tier_of(b);
  if (t == nullptr) return KVT_ERR_INVALID_HANDLE;
  *out = t->id();
  return KVT_OK;
}

kvt_status PipelineTiers::peek(kvt_block b, uint64_t *hash, uint64_t *parent) {
  return m_.tier_if_present(handle::tier(b))->peek_registered(b, hash, parent);
}

kvt_status PipelineTiers::expect_empty(kvt_block b) {
  return m_.tier_if_present(handle::tier(b))->expect_empty(b);
}

bool PipelineTiers::holds(kvt_tier t, uint64_t hash) {
  return m_.tier_if_present(t)->contains(hash);
}

void PipelineTiers::retain(kvt_tier t, const kvt_block *b, size_t n, bool *ok) {
  Tier *tier = m_.tier_if_present(t);
  for (size_t i = 0; i < n; ++i) ok[i] = tier->retain(b[i], Holder::Pipeline) == KVT_OK;
}

void PipelineTiers::pin_empty(const kvt_block *b, size_t n, bool *ok) {
  for (size_t i = 0; i < n; ++i)
    ok[i] = m_.tier_if_present(handle::tier(b[i]))->pin_empty(b[i]) == KVT_OK;
}

kvt_status PipelineTiers::alloc(kvt_tier t, kvt_block *out, size_t n) {
  return m_.tier_if_present(t)->alloc(out, n, Holder::Pipeline);
}

void PipelineTiers::store(kvt_tier t, kvt_block *b, const uint64_t *hash,
                          const uint64_t *parent, size_t n) {
  Tier *tier = m_.tier_if_present(t);
  for (size_t i = 0; i < n; ++i) tier->register_hash(&b[i], b[i], hash[i], parent[i]);
}

void PipelineTiers::commit_onboarded(kvt_block *out, const kvt_block *b, const uint64_t *hash,
                                     const uint64_t *parent, size_t n, bool pin_existing) {
  for (size_t i = 0; i < n; ++i)
    m_.tier_if_present(handle::tier(b[i]))
        ->commit_onboarded(&out[i], b[i], hash[i], parent[i], pin_existing);
}

void PipelineTiers::hand_over(const kvt_block *replaced, size_t n) {
  for (size_t i = 0; i < n; ++i)
    m_.tier_if_present(handle::tier(replaced[i]))->hand_over(replaced[i]);
}

void PipelineTiers::remove(kvt_block b) { m_.tier_if_present(handle::tier(b))->remove(b); }

void PipelineTiers::release(const kvt_block *b, size_t n) {
  if (n > 0) m_.release(b, n, Holder::Pipeline);
}

uint64_t PipelineTiers::pipeline_refs() {
  uint64_t n = 0;
  for (int t = KVT_TIER_G1; t <= KVT_TIER_G3; ++t)
    if (Tier *tier = m_.tier_if_present(t)) n += tier->refs_held(Holder::Pipeline);
  return n;
}

}  // namespace kvt
