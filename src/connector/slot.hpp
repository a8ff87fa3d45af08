// One request's slot: the seed 004 state machine and what the scheduler half knows about
// the request (its tokens and hashes, its G1 blocks, its pins and outstanding copies).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "hash/token_seq.hpp"
#include "common/names.hpp"
#include "kvtier.h"

namespace kvt::conn {

using SlotState = kvt_slot_state;
inline constexpr int kSlotStates = 11;  // 1..10, and 0 for "no slot yet"

// Whether from -> to is a transition of the table in kvtier.h.
bool legal(SlotState from, SlotState to) noexcept;
// KVT_OK for a request id of 1..KVT_REQ_ID_MAX bytes, else KVT_ERR_INVALID_ARGUMENT.
kvt_status check_id(const char *fn, const char *id) noexcept;
// A checked id into an inspection record's zeroed req_id field.
inline void copy_id(char (&dst)[KVT_REQ_ID_MAX + 1], const std::string &id) noexcept {
  std::memcpy(dst, id.data(), std::min<size_t>(id.size(), KVT_REQ_ID_MAX));
}

// A G2/G3 block the slot holds one reference on, matched for a load.
struct Pinned {
  kvt_block block;
  uint64_t hash, parent;
};

struct Slot {
  Slot(std::string id, TokenSeq seq) : id(std::move(id)), seq(std::move(seq)) {}

  std::string id;
  std::chrono::steady_clock::time_point born = std::chrono::steady_clock::now();
  SlotState state = KVT_SLOT_INITIALIZED;
  std::vector<uint32_t> history{KVT_SLOT_INITIALIZED};

  TokenSeq seq;                  // its tokens so far: their count and full blocks' hashes
  std::vector<uint32_t> blocks;  // its G1 block ids, in order
  uint64_t computed = 0;         // tokens whose KV is computed or loaded, after the last step
  uint64_t write_from = 0;       // first block it writes: blocks before are the engine's hit
  size_t store_next = 0;         // eager: the first full block not yet considered for a store
  uint64_t matched_from = 0;     // get_num_new_matched_tokens' num_computed_tokens
  std::vector<Pinned> staged;    // ONBOARD_STAGED: the hit, G2 blocks then G3 blocks
  size_t staged_from = 0;        // the block index of staged[0]: a sliding window's hit
                                 // loads only its last blocks
  size_t released_below = 0;     // sliding window: blocks before it left the window, and
                                 // the engine may have given them to other requests
  uint64_t reach = 0;            // the furthest token it was scheduled to compute
  uint64_t batches = 0;          // load and store batches in the metadata, not yet reported
  uint64_t async_loads = 0;      // of those, asynchronous loads: the engine waits for their
                                 // finished_recving, never for finished_sending
  bool new_this_step = false;    // in the current build's schedule
  // get_num_new_matched_tokens preempted it (the engine sent it back to waiting unasked):
  // the engine's own request_preempted for it, in the same step, is then a no-op.
  bool preempted_unasked = false;

  void to(SlotState s) {
    state = s;
    history.push_back(s);
  }
};

}  // namespace kvt::conn
