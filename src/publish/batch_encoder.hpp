// One KV-event batch as vLLM's msgspec encoder writes it (docs/KV_EVENTS.md): the msgpack
// array [ts, [events...], data_parallel_rank], each event a tagged array:
//   ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium]
//   ["BlockRemoved", block_hashes, medium]
//   ["AllBlocksCleared"]
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kvtier.h"
#include "publish/token_memo.hpp"

namespace kvt::pub {

// A tier's event as the publisher queues it.
struct QueuedEvent {
  uint64_t hash, parent;
  uint8_t type;  // kvt_event_type: BLOCK_STORED, BLOCK_REMOVED or TIER_CLEARED
  uint8_t tier;
};

// vLLM's medium of a tier's blocks: G1 is where the engine computes ("GPU", whatever memory
// backs it), G2 host memory ("CPU"), G3 local disk ("DISK").
const char *medium_of(unsigned tier) noexcept;

class BatchEncoder {
 public:
  // tiers: bit (1 << tier) for each tier present whose events are published.
  BatchEncoder(uint32_t page_size, int32_t dp_rank, unsigned tiers);

  // Encodes events into *out (replaced) and returns how many vLLM events it holds, 0 for
  // none (then nothing is to be sent). Consecutive stored blocks of one tier that chain
  // (each the parent of the next) and whose tokens are all known, or all unknown, become
  // one BlockStored; consecutive removals of one tier one BlockRemoved. A TIER_CLEARED
  // becomes AllBlocksCleared when it completes the clearing of every published tier with
  // no block stored in between (kvt_manager_reset of every tier); a single tier's clearing
  // is already told by its BlockRemoved events.
  size_t encode(const std::vector<QueuedEvent> &events, double ts, TokenMemo &memo,
                std::string *out);

 private:
  struct Group {
    uint8_t type;  // kvt_event_type
    uint8_t tier;
    bool tokens;     // BlockStored: token_ids are known
    size_t begin, end;  // events[begin, end)
  };
  const uint32_t page_size_;
  const int32_t dp_rank_;
  const unsigned tiers_;
  unsigned cleared_ = 0;  // tiers cleared since the last AllBlocksCleared, none stored since
  std::vector<Group> groups_;
  std::vector<uint32_t> tokens_;       // of the stored events, in order
  std::vector<size_t> token_at_;       // events[i]'s first token in tokens_, or npos
};

}  // namespace kvt::pub
