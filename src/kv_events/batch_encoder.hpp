// One KV-event batch as vLLM's msgspec encoder writes it (docs/KV_EVENTS.md): the msgpack
// array [ts, [events...], data_parallel_rank] (EventBatch is array_like), each event in the
// configured format:
//   CURRENT (vLLM main, tagged structs with omit_defaults), maps in declaration order:
//     {"type": "BlockStored", "block_hashes", "parent_block_hash", "token_ids",
//      "block_size", "lora_id", "medium", "lora_name"}   (the fields without a default)
//     {"type": "BlockRemoved", "block_hashes", "medium"}
//     {"type": "AllBlocksCleared"}
//   ARRAY_V0_11 (vLLM 0.10/0.11, array_like), tagged arrays:
//     ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium]
//     ["BlockRemoved", block_hashes, medium]
//     ["AllBlocksCleared"]
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kvtier.h"
#include "kv_events/token_memo.hpp"

namespace kvt::pub {

// A tier's event as the publisher queues it.
struct QueuedEvent {
  uint64_t hash, parent;
  uint8_t type;  // kvt_event_type: BLOCK_STORED, BLOCK_REMOVED or TIER_CLEARED
  uint8_t tier;
  bool held;     // BLOCK_STORED: the memo holds its tokens for the encoder (TokenMemo::stored)
};

// vLLM's medium of a tier's blocks in a format (docs/KV_EVENTS.md).
const char *medium_of(unsigned tier, kvt_kv_events_format format) noexcept;

class BatchEncoder {
 public:
  // tiers: bit (1 << tier) for each tier present whose events are published.
  BatchEncoder(uint32_t page_size, int32_t dp_rank, unsigned tiers, kvt_kv_events_format format);

  // Encodes events into *out (replaced) and returns how many vLLM events it holds, 0 for
  // none (then nothing is to be sent). Takes every stored block's tokens from the memo,
  // dropping its hold, even when it throws; without a memo (a snapshot's blocks, which no
  // queued event holds) every token_ids is [], and none counts as unknown. Consecutive
  // stored blocks of one tier that chain (each the parent of the next) and whose tokens are
  // all known, or all unknown, become one BlockStored; consecutive removals of one tier one
  // BlockRemoved. A TIER_CLEARED becomes AllBlocksCleared when it completes the clearing of
  // every published tier with no block stored in between (kvt_manager_reset of every
  // tier); a single tier's clearing is already told by its BlockRemoved events.
  size_t encode(const std::vector<QueuedEvent> &events, double ts, TokenMemo *memo,
                std::string *out);
  // Stored blocks of the last encode whose tokens were unknown (published as []).
  uint64_t unknown_tokens() const noexcept { return unknown_; }

 private:
  struct Group {
    uint8_t type;  // kvt_event_type
    uint8_t tier;
    bool tokens;     // BlockStored: token_ids are known
    size_t begin, end;  // events[begin, end)
  };
  void group(const std::vector<QueuedEvent> &events, TokenMemo *memo);

  const uint32_t page_size_;
  const int32_t dp_rank_;
  const unsigned tiers_;
  const kvt_kv_events_format format_;
  unsigned cleared_ = 0;  // tiers cleared since the last AllBlocksCleared, none stored since
  uint64_t unknown_ = 0;
  std::vector<Group> groups_;
  std::vector<uint32_t> tokens_;       // of the stored events, in order
  std::vector<size_t> token_at_;       // events[i]'s first token in tokens_, or npos
};

}  // namespace kvt::pub
