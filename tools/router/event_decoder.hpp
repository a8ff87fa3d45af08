// Decodes the payload of a KV-event message as vLLM's msgspec schema defines it
// (vllm/distributed/kv_events.py): KVEventBatch [ts, [events...], data_parallel_rank], each
// event a tagged BlockStored, BlockRemoved or AllBlocksCleared. The bytes come from the
// network: anything else is refused with a message, never trusted.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace kvt::router {

enum class EventKind { Stored, Removed, Cleared };

struct Event {
  EventKind kind = EventKind::Cleared;
  std::vector<uint64_t> hashes;   // block_hashes (Stored, Removed)
  std::optional<uint64_t> parent; // parent_block_hash (Stored)
  size_t n_tokens = 0;            // len(token_ids) (Stored)
  int64_t block_size = 0;         // (Stored)
  std::optional<std::string> medium;  // absent or nil: none
};

struct Batch {
  double ts = 0;
  std::vector<Event> events;
  std::optional<int64_t> dp_rank;
};

// Both of msgspec's layouts are accepted, as msgspec would decode them into vLLM's structs:
// arrays (vLLM 0.10/0.11's array_like events: fields by position, extra trailing elements
// ignored, absent trailing fields with defaults taking them) and maps (vLLM main, 0231dd5
// and since #42892, and kvtier by default: {"type": "BlockStored", ...}, fields by name,
// unknown keys such as lora_name or group_idx ignored). Required: ts and
// events; block_hashes, parent_block_hash, token_ids, block_size and lora_id of BlockStored
// (the fields every vLLM version has declared); block_hashes of BlockRemoved. medium may
// be absent (vLLM before it existed) and data_parallel_rank too. Block hashes are integers
// (a negative one, from Python's hash() in old vLLM, is kept as its 64-bit pattern). One
// bad event refuses the whole batch, as msgspec does.
bool decode_batch(const uint8_t *data, size_t len, Batch *out, std::string *error);

}  // namespace kvt::router
