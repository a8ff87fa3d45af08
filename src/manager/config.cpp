#include "manager/config.hpp"

#include <xxhash.h>

#include <bit>
#include <new>

#include "common/error.hpp"

namespace kvt {

namespace {
constexpr uint64_t kMaxBlockBytes = uint64_t{1} << 32;
constexpr uint64_t kMaxEventCapacity = uint64_t{1} << 24;
unsigned long long ull(uint64_t v) { return v; }

kvt_status validate_layout(const kvt_manager_config &c) {
  const kvt_g1_layout &l = *c.g1_layout;
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
kvt_status validate_policy(const char *name, const kvt_policy &p) {
  if (p.flags & ~(KVT_POLICY_PRESENCE | KVT_POLICY_FREQUENCY))
    return fail(KVT_ERR_INVALID_ARGUMENT,
                "%s.flags is 0x%x: KVT_POLICY_PRESENCE (1) and/or KVT_POLICY_FREQUENCY (2), or 0",
                name, p.flags);
  if ((p.flags & KVT_POLICY_FREQUENCY) && p.min_frequency == 0)
    return fail(KVT_ERR_INVALID_ARGUMENT, "%s.min_frequency is 0: at least 1", name);
  return KVT_OK;
}

kvt_status validate_pipeline(const kvt_manager_config &c) {
  constexpr uint64_t kMinute = 60'000'000;
  if (c.max_batch_size == 0 || c.max_batch_size > 65536)
    return fail(KVT_ERR_INVALID_ARGUMENT, "max_batch_size is %u: 1..65536", c.max_batch_size);
  if (c.min_batch_size == 0 || c.min_batch_size > c.max_batch_size)
    return fail(KVT_ERR_INVALID_ARGUMENT, "min_batch_size is %u: 1..max_batch_size (%u)",
                c.min_batch_size, c.max_batch_size);
  if (c.flush_interval_us > kMinute)
    return fail(KVT_ERR_INVALID_ARGUMENT, "flush_interval_us is %llu: at most 60 s",
                ull(c.flush_interval_us));
  if (c.policy_timeout_us == 0 || c.policy_timeout_us > kMinute)
    return fail(KVT_ERR_INVALID_ARGUMENT, "policy_timeout_us is %llu: 1 us to 60 s",
                ull(c.policy_timeout_us));
  if (c.sweep_interval_us < 10 || c.sweep_interval_us > kMinute)
    return fail(KVT_ERR_INVALID_ARGUMENT, "sweep_interval_us is %llu: 10 us to 60 s",
                ull(c.sweep_interval_us));
  if (c.max_concurrent_transfers == 0 || c.max_concurrent_transfers > 64)
    return fail(KVT_ERR_INVALID_ARGUMENT, "max_concurrent_transfers is %u: 1..64",
                c.max_concurrent_transfers);
  if (c.copy_threads == 0 || c.copy_threads > 64)
    return fail(KVT_ERR_INVALID_ARGUMENT, "copy_threads is %u: 1..64", c.copy_threads);
  if (kvt_status s = validate_policy("policy_g1_g2", c.policy_g1_g2); s != KVT_OK) return s;
  if (kvt_status s = validate_policy("policy_g1_g3", c.policy_g1_g3); s != KVT_OK) return s;
  if (kvt_status s = validate_policy("policy_g2_g3", c.policy_g2_g3); s != KVT_OK) return s;
  if (c.g3_io > KVT_IO_THREADS)
    return fail(KVT_ERR_INVALID_ARGUMENT, "g3_io is %u: AUTO (0), URING (1) or THREADS (2)",
                c.g3_io);
  if (c.cuda_copy > KVT_CUDA_COPY_AUTO)
    return fail(KVT_ERR_INVALID_ARGUMENT,
                "cuda_copy is %u: BATCHED (0), PER_CHUNK (1), KERNEL (2) or AUTO (3)",
                c.cuda_copy);
  return KVT_OK;
}

kvt_status validate_g3(const kvt_manager_config &c) {
  if (c.g3_path != nullptr && c.g3_path[0] == '\0')
    return fail(KVT_ERR_INVALID_ARGUMENT,
                "g3_path is \"\": a directory, or NULL for a temporary one");
  if (c.g3_persist > 1)
    return fail(KVT_ERR_INVALID_ARGUMENT, "g3_persist is %u: 0 or 1", c.g3_persist);
  if (c.g3_key_env != nullptr && c.g3_blocks == 0)
    return fail(KVT_ERR_INVALID_ARGUMENT, "g3_key_env is set, and there is no G3 (g3_blocks 0)");
  if (c.g3_persist && (c.g3_blocks == 0 || c.g3_path == nullptr))
    return fail(KVT_ERR_INVALID_ARGUMENT,
                "g3_persist needs G3 (g3_blocks > 0) and a g3_path to keep its file in");
  if (c.g3_on_mismatch > KVT_G3_RESET)
    return fail(KVT_ERR_INVALID_ARGUMENT, "g3_on_mismatch is %u: REFUSE (0) or RESET (1)",
                c.g3_on_mismatch);
  if (c.g3_fault_op > KVT_G3_FAULT_READ)
    return fail(KVT_ERR_INVALID_ARGUMENT, "g3_fault_op is %u: OFF (0), WRITE (1) or READ (2)",
                c.g3_fault_op);
  if (c.g3_fault_op == KVT_G3_FAULT_OFF) {
    if (c.g3_fault_errno != 0 || c.g3_fault_skip != 0 || c.g3_fault_count != 0)
      return fail(KVT_ERR_INVALID_ARGUMENT,
                  "g3_fault_errno, g3_fault_skip and g3_fault_count must be 0 while "
                  "g3_fault_op is OFF");
    return KVT_OK;
  }
  if (c.g3_fault_errno <= 0 || c.g3_fault_errno > 4095)
    return fail(KVT_ERR_INVALID_ARGUMENT, "g3_fault_errno is %d: an errno value, 1..4095",
                c.g3_fault_errno);
  if (c.g3_fault_count == 0)
    return fail(KVT_ERR_INVALID_ARGUMENT,
                "g3_fault_count is 0: at least 1 operation to fail while g3_fault_op is on");
  return KVT_OK;
}

kvt_status validate_kv_events(const kvt_manager_config &c) {
  if (c.kv_events_endpoint != nullptr && c.kv_events_endpoint[0] == '\0')
    return fail(KVT_ERR_INVALID_ARGUMENT,
                "kv_events_endpoint is \"\": a ZMQ endpoint, or NULL for no publisher");
  if (c.kv_events_replay_endpoint != nullptr) {
    if (c.kv_events_endpoint == nullptr)
      return fail(KVT_ERR_INVALID_ARGUMENT,
                  "kv_events_replay_endpoint is set but kv_events_endpoint is NULL: replay "
                  "serves what the publisher sent");
    if (c.kv_events_replay_endpoint[0] == '\0')
      return fail(KVT_ERR_INVALID_ARGUMENT,
                  "kv_events_replay_endpoint is \"\": a ZMQ endpoint, or NULL for none");
  }
  if (c.kv_events_buffer == 0 || c.kv_events_buffer > kMaxEventCapacity)
    return fail(KVT_ERR_INVALID_ARGUMENT, "kv_events_buffer is %llu: 1..%llu",
                ull(c.kv_events_buffer), ull(kMaxEventCapacity));
  if (c.kv_events_dp_rank < 0)
    return fail(KVT_ERR_INVALID_ARGUMENT, "kv_events_dp_rank is %d: at least 0",
                c.kv_events_dp_rank);
  constexpr uint32_t kTiers = (1u << KVT_TIER_G1) | (1u << KVT_TIER_G2) | (1u << KVT_TIER_G3);
  if (c.kv_events_tiers & ~kTiers)
    return fail(KVT_ERR_INVALID_ARGUMENT,
                "kv_events_tiers is 0x%x: bits (1 << KVT_TIER_G1..G3), 0x2 | 0x4 | 0x8 at most "
                "(G4 has no block events)",
                c.kv_events_tiers);
  if (c.kv_events_format > KVT_KV_EVENTS_FORMAT_ARRAY_V0_11)
    return fail(KVT_ERR_INVALID_ARGUMENT,
                "kv_events_format is %u: KVT_KV_EVENTS_FORMAT_CURRENT (0) or "
                "KVT_KV_EVENTS_FORMAT_ARRAY_V0_11 (1)",
                c.kv_events_format);
  if (c.reserved != 0)
    return fail(KVT_ERR_INVALID_ARGUMENT, "reserved is %u: must be 0", c.reserved);
  return KVT_OK;
}

kvt_status validate_g4(const kvt_manager_config &c) {
  if (c.g4_timeout_us == 0)
    return fail(KVT_ERR_INVALID_ARGUMENT, "g4_timeout_us is 0: at least 1 us");
  if (c.g4_url == nullptr) return KVT_OK;
  if (c.chunk_bytes == 0)
    return fail(KVT_ERR_INVALID_ARGUMENT,
                "g4_url is set but chunk_bytes is 0: G4 holds block bytes, and these have none");
  remote::Config rc;
  return g4_config(&rc, c);
}
}  // namespace

uint64_t g4_layout(const kvt_manager_config &c) noexcept {
  // G3's file names the same fields (docs/G3_FORMAT.md); its slot count and namespace are
  // its own, and G4 has its namespace apart (g4_namespace).
  const uint64_t fields[5] = {0x344774766b /* "kvtG4" */, c.page_size, c.num_layers,
                              c.num_outer, c.chunk_bytes};
  return XXH3_64bits(fields, sizeof fields);
}

kvt_status g4_config(remote::Config *out, const kvt_manager_config &c) {
  try {
    return remote::parse_config(out, c, g4_layout(c));
  } catch (const std::bad_alloc &) {
    return fail(KVT_ERR_NO_MEMORY, "g4_url: out of memory");
  }
}

PipelineConfig pipeline_config(const kvt_manager_config &c) noexcept {
  PipelineConfig p;
  p.max_batch_size = c.max_batch_size;
  p.min_batch_size = c.min_batch_size;
  p.flush_interval = std::chrono::microseconds(c.flush_interval_us);
  p.policy_timeout = std::chrono::microseconds(c.policy_timeout_us);
  p.sweep_interval = std::chrono::microseconds(c.sweep_interval_us);
  p.executors = c.max_concurrent_transfers;
  p.policies[index(Direction::G1toG2)] = c.policy_g1_g2;
  p.policies[index(Direction::G1toG3)] = c.policy_g1_g3;
  p.policies[index(Direction::G2toG3)] = c.policy_g2_g3;
  return p;
}

DiskConfig disk_config(const kvt_manager_config &c) noexcept {
  DiskConfig d;
  d.dir = c.g3_path;
  d.blocks = c.g3_blocks;
  d.page_size = c.page_size;
  d.num_layers = c.num_layers;
  d.num_outer = c.num_outer;
  d.chunk_bytes = c.chunk_bytes;
  d.ns = c.g3_namespace;
  d.persist = c.g3_persist != 0;
  d.on_mismatch = c.g3_on_mismatch;
  d.key_env = c.g3_key_env;
  d.io = c.g3_io;
  d.rings = c.max_concurrent_transfers;  // one per executor
  d.io_threads = c.copy_threads - 1;     // the calling executor takes part too
  d.fault_op = c.g3_fault_op;
  d.fault_errno = c.g3_fault_errno;
  d.fault_skip = c.g3_fault_skip;
  d.fault_count = c.g3_fault_count;
  return d;
}

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
  cfg->max_batch_size = 64;
  cfg->min_batch_size = 8;
  cfg->flush_interval_us = 10000;
  cfg->policy_timeout_us = 100000;
  cfg->sweep_interval_us = 10000;
  cfg->max_concurrent_transfers = 1;
  cfg->copy_threads = 4;
  cfg->policy_g1_g2 = cfg->policy_g1_g3 = cfg->policy_g2_g3 = {KVT_POLICY_PRESENCE, 1};
  cfg->g3_io = KVT_IO_AUTO;
  cfg->cuda_copy = KVT_CUDA_COPY_AUTO;
  cfg->max_pinned_percent = 50;
  cfg->kv_events_buffer = 10000;
  cfg->kv_events_tiers = (1u << KVT_TIER_G1) | (1u << KVT_TIER_G2) | (1u << KVT_TIER_G3);
  cfg->g4_timeout_us = 1000000;
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
  if (kvt_status s = validate_pipeline(c); s != KVT_OK) return s;
  if (kvt_status s = validate_g3(c); s != KVT_OK) return s;
  for (int t = 0; t < 3; ++t)
    if (c.eviction[t] > KVT_EVICT_S3FIFO)
      return fail(KVT_ERR_INVALID_ARGUMENT, "eviction[%d] (G%d) is %u: LRU (0) or S3FIFO (1)", t,
                  t + 1, c.eviction[t]);
  if (c.max_pinned_percent > 100)
    return fail(KVT_ERR_INVALID_ARGUMENT, "max_pinned_percent is %u: 0..100",
                c.max_pinned_percent);
  if (kvt_status s = validate_kv_events(c); s != KVT_OK) return s;
  if (kvt_status s = validate_g4(c); s != KVT_OK) return s;
  if (c.g1_layout != nullptr) return validate_layout(c);
  return KVT_OK;
}

}  // namespace kvt
