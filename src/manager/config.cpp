#include "manager/config.hpp"

#include <bit>

#include "common/error.hpp"

namespace kvt {

namespace {
constexpr uint64_t kMaxBlockBytes = uint64_t{1} << 32;
constexpr uint64_t kMaxEventCapacity = uint64_t{1} << 24;
unsigned long long ull(uint64_t v) { return v; }

kvt_status validate_layout(const kvt_manager_config &c) {
  const kvt_g1_layout &l = *c.g1_layout;
  if (l.struct_size != sizeof(kvt_g1_layout))
    return fail(KVT_ERR_INVALID_ARGUMENT,
                "g1_layout->struct_size is %u, this library expects %zu", l.struct_size,
                sizeof(kvt_g1_layout));
  if (l.memory != KVT_MEMORY_HOST && l.memory != KVT_MEMORY_CUDA)
    return fail(KVT_ERR_INVALID_ARGUMENT,
                "g1_layout->memory is %u: KVT_MEMORY_HOST (1) or KVT_MEMORY_CUDA (2)", l.memory);
  if (l.reserved != 0)
    return fail(KVT_ERR_INVALID_ARGUMENT, "g1_layout->reserved must be 0");
  if (l.bases == nullptr || l.strides == nullptr)
    return fail(KVT_ERR_INVALID_ARGUMENT, "g1_layout->bases and ->strides must not be NULL");
  for (uint64_t i = 0; i < uint64_t{c.num_layers} * c.num_outer; ++i) {
    if (l.bases[i] == nullptr && c.chunk_bytes > 0)
      return fail(KVT_ERR_INVALID_ARGUMENT, "g1_layout->bases[%llu] is NULL", ull(i));
    if (l.strides[i] < c.chunk_bytes)
      return fail(KVT_ERR_INVALID_ARGUMENT,
                  "g1_layout->strides[%llu] is %llu, smaller than chunk_bytes %llu", ull(i),
                  ull(l.strides[i]), ull(c.chunk_bytes));
  }
  return KVT_OK;
}
}  // namespace

void config_defaults(kvt_manager_config *cfg) noexcept {
  *cfg = kvt_manager_config{};
  cfg->struct_size = sizeof(kvt_manager_config);
  cfg->page_size = 16;
  cfg->num_layers = 1;
  cfg->num_outer = 2;
  cfg->chunk_bytes = 4096;
  cfg->g1_blocks = 1024;
  cfg->g2_blocks = 4096;
  cfg->g3_blocks = 0;
  cfg->event_capacity = 65536;
  cfg->g1_memory = KVT_MEMORY_AUTO;
}

kvt_status config_validate(const kvt_manager_config &c) noexcept {
  if (c.page_size == 0 || c.page_size > 65536 || !std::has_single_bit(c.page_size))
    return fail(KVT_ERR_INVALID_ARGUMENT, "page_size is %u: a power of two in 1..65536",
                c.page_size);
  if (c.num_layers == 0 || c.num_layers > 65536)
    return fail(KVT_ERR_INVALID_ARGUMENT, "num_layers is %u: 1..65536", c.num_layers);
  if (c.num_outer != 1 && c.num_outer != 2)
    return fail(KVT_ERR_INVALID_ARGUMENT, "num_outer is %u: 1 (fused K/V, MLA) or 2 (K and V)",
                c.num_outer);
  if (c.chunk_bytes > kMaxBlockBytes ||
      c.chunk_bytes * c.num_layers * c.num_outer > kMaxBlockBytes)
    return fail(KVT_ERR_INVALID_ARGUMENT,
                "chunk_bytes %llu x %u layers x %u makes blocks over 4 GiB", ull(c.chunk_bytes),
                c.num_layers, c.num_outer);
  if (c.g1_blocks == 0 || c.g1_blocks > KVT_MAX_TIER_BLOCKS)
    return fail(KVT_ERR_INVALID_ARGUMENT, "g1_blocks is %llu: 1..%llu", ull(c.g1_blocks),
                ull(KVT_MAX_TIER_BLOCKS));
  if (c.g2_blocks > KVT_MAX_TIER_BLOCKS)
    return fail(KVT_ERR_INVALID_ARGUMENT, "g2_blocks is %llu: 0..%llu", ull(c.g2_blocks),
                ull(KVT_MAX_TIER_BLOCKS));
  if (c.g3_blocks > KVT_MAX_TIER_BLOCKS)
    return fail(KVT_ERR_INVALID_ARGUMENT, "g3_blocks is %llu: 0..%llu", ull(c.g3_blocks),
                ull(KVT_MAX_TIER_BLOCKS));
  if (c.event_capacity == 0 || c.event_capacity > kMaxEventCapacity)
    return fail(KVT_ERR_INVALID_ARGUMENT, "event_capacity is %llu: 1..%llu",
                ull(c.event_capacity), ull(kMaxEventCapacity));
  if (c.g1_memory > KVT_MEMORY_CUDA)
    return fail(KVT_ERR_INVALID_ARGUMENT, "g1_memory is %u: AUTO (0), HOST (1) or CUDA (2)",
                c.g1_memory);
  if (c.cuda_device < 0)
    return fail(KVT_ERR_INVALID_ARGUMENT, "cuda_device is %d", c.cuda_device);
  if (c.g1_layout != nullptr) return validate_layout(c);
  return KVT_OK;
}

}  // namespace kvt
