// One block's metadata in a tier's slot array, and its states.
#pragma once

#include <cstdint>

#include "block/handle.hpp"
#include "kvtier.h"

namespace kvt {

// kvt_block_state values, plus Free for slots that hold nothing and Retired for slots that
// used their last generation and are never handed out again.
enum class State : uint8_t {
  Free = 0,
  Empty = KVT_BLOCK_EMPTY,
  Partial = KVT_BLOCK_PARTIAL,
  Ready = KVT_BLOCK_READY,
  Inflight = KVT_BLOCK_INFLIGHT,
  Complete = KVT_BLOCK_COMPLETE,
  Registered = KVT_BLOCK_REGISTERED,
  Inactive = KVT_BLOCK_INACTIVE,
  Removed = 8,  // left the registry (a G3 copy failed its checksum); freed at its last release
  Retired = 15,
};

// 32 bytes of metadata per block. Zero bytes are a valid Free slot, so the array can come
// from calloc and cost nothing until touched.
struct Slot {
  uint64_t seq_hash;
  uint64_t parent_hash;
  uint32_t refs;
  uint32_t gen : handle::kGenBits;
  uint32_t state : 4;
  uint32_t prev;  // eviction queue links (eviction_queue.hpp); `next` also links the free list
  uint32_t next;
};
static_assert(sizeof(Slot) == 32);

inline constexpr uint32_t kNilSlot = UINT32_MAX;  // the end of a list of slots

}  // namespace kvt
