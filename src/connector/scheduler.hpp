// The connector's scheduler half: slots by request id, the G2/G3 hits they stage, the loads
// and stores it plans into each step's metadata, and the pins it holds until the worker's
// report says the copies ended. It never touches block bytes. Its slots are a SlotTable
// (slot_table.hpp), its loads a LoadPlanner (load_planner.hpp) and its stores a
// StorePlanner (store_planner.hpp); the class itself is in three files: the calls
// (scheduler.cpp), the two that find and take a hit (scheduler_onboard.cpp), and its side
// of the slots (scheduler_slots.cpp).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "connector/breakpoints.hpp"
#include "connector/load_planner.hpp"
#include "connector/metadata.hpp"
#include "connector/slot.hpp"
#include "connector/slot_table.hpp"
#include "connector/store_planner.hpp"
#include "event/obs_sink.hpp"
#include "kvtier.h"

namespace kvt {
class Manager;
}  // namespace kvt

namespace kvt::conn {

// The capacities of m and the world's size, which both halves must agree on, and the
// refusal of a message (what: "metadata", "report") from a connector with others.
Shape shape_of(const Manager &m, uint32_t world_size);
kvt_status check_shape(const char *fn, const char *what, const Shape &got, const Shape &have);

class Scheduler {
 public:
  // c has been validated: store_tier is present in m, num_gpu_blocks resolved.
  Scheduler(Manager &m, const kvt_connector_config &c);
  ~Scheduler();  // drops every pin
  Scheduler(const Scheduler &) = delete;
  Scheduler &operator=(const Scheduler &) = delete;

  // The six calls of the scheduler half; each emits a CALL event when the stream is on.
  // salt: the request's own salt_hash (the config's when it has none).
  // max_tokens: the hit's cap (get_num_new_matched_tokens_max), else UINT64_MAX.
  kvt_status get_num_new_matched_tokens(uint64_t *out, std::string_view id, uint64_t salt,
                                        const uint32_t *tokens, size_t n, uint64_t computed,
                                        uint64_t max_tokens = UINT64_MAX);
  kvt_status update_state_after_alloc(std::string_view id, const uint32_t *blocks, size_t n,
                                      uint64_t external);
  // *out: the encoded metadata.
  kvt_status build_connector_meta(std::string *out, const kvt_scheduled_request *reqs, size_t n);
  kvt_status update_connector_output(const Report &r);
  kvt_status request_finished(bool *delay_free, std::string_view id);
  kvt_status request_preempted(std::string_view id);
  // kvt_connector_reset_cache.
  kvt_status reset_cache();
  // The state and the history of a live or recently finished request.
  kvt_status slot_state(uint32_t *state, const std::vector<uint32_t> **history,
                        std::string_view id) const;
  void stats(kvt_connector_stats *out) const;
  // The slots, the batches in flight and the counters, for inspection.
  Snapshot snapshot() const;
  // Synchronized by itself: callable without the connector's lock, which a pause holds.
  Breakpoints &breakpoints() noexcept { return bp_; }
  // kvt_connector_set_hooks; the ABI runs will_call and finished_call around each call.
  kvt_connector_hooks &hooks() noexcept { return hooks_; }
  const Shape &shape() const noexcept { return shape_; }
  bool load_async() const noexcept { return cfg_.load_async != 0; }
  uint64_t salt() const noexcept { return cfg_.salt_hash; }

 private:
  // ---- the calls (scheduler.cpp, scheduler_onboard.cpp): each public call is its body
  // and the CALL event ----
  kvt_status get_num_new_matched_tokens_impl(uint64_t *out, std::string_view id,
                                             uint64_t salt, const uint32_t *tokens, size_t n,
                                             uint64_t computed, uint64_t max_tokens);
  kvt_status update_state_after_alloc_impl(std::string_view id, const uint32_t *blocks,
                                           size_t n, uint64_t external);
  kvt_status build_connector_meta_impl(std::string *out, const kvt_scheduled_request *reqs,
                                       size_t n);
  kvt_status update_connector_output_impl(const Report &r);
  kvt_status request_finished_impl(bool *delay_free, std::string_view id);
  kvt_status request_preempted_impl(std::string_view id);
  kvt_status reset_cache_impl();
  template <class Fill>
  void call_event(std::string_view id, kvt_status st, Fill &&fill) noexcept;

  // ---- its slots (scheduler_slots.cpp; the table is slot_table.hpp) ----
  kvt_status transition_error(const char *fn, const Slot &s, SlotState to) const;
  void move(Slot &s, SlotState to);
  void slot_event(const Slot &s, uint32_t prev, uint32_t to);  // observe SLOT
  kvt_status check_blocks(const char *fn, const Slot &s, const uint32_t *ids, size_t n,
                          uint32_t stamp);
  // Appends to s's tokens; with KV events on, notes the tokens of the blocks they fill.
  void append_tokens(Slot &s, const uint32_t *tokens, size_t n);
  void to_waiting(Slot &s);  // request_preempted's work: the engine took its blocks back
  void finish(Slot &s);

  // Sliding window: whether t's block b left t's window (the engine may have freed it);
  // t's blocks that left it at this step go back to the engine.
  bool left_window(const Slot &t, uint32_t b) const;
  void release_window(Slot &s, uint64_t computed);
  // s now writes G1 block g1 (the store planner stores what it held first, when lazy).
  void claim(Slot &s, uint32_t g1);
  // Blocks s wrote are the engine's again.
  void unclaim(Slot &s);

  Manager &m_;
  kvt_connector_config cfg_;
  Shape shape_;
  uint32_t page_;
  // Sliding window: the blocks before a hit's end it needs (vLLM's
  // cdiv(sliding_window - 1, block_size), at least 1); 0 for full attention.
  const size_t window_blocks_;

  SlotTable slots_;
  std::vector<Slot *> writer_;       // per G1 block: the live slot that writes it
  std::vector<uint32_t> stamp_;      // per G1 block: duplicate detection within one call
  uint32_t stamp_now_ = 0;
  uint64_t next_batch_ = 1, step_ = 0;
  std::vector<std::string> finishing_;      // finished with batches outstanding, to announce

  kvt_connector_stats stats_{};
  // After what they refer to: writer_, next_batch_, stats_, and the loads to the stores.
  StorePlanner stores_;
  LoadPlanner loads_;
  kvt_obs_trigger trigger_ = KVT_TRIGGER_GET_NUM_NEW_MATCHED_TOKENS;  // the call in progress
  // The last get_num_new_matched_tokens was given the slot's own tokens: its CALL event
  // logs their number only (a waiting request is asked again at every step).
  bool own_tokens_ = false;
  Breakpoints bp_;
  kvt_connector_hooks hooks_{};
  // At a call's start (prev = state = 0) or after a transition: a breakpoint may pause here.
  void stop_point(std::string_view id, uint32_t prev, uint32_t state) {
    if (bp_.armed()) bp_.check(trigger_, id, prev, state, [this] { return snapshot(); });
  }
};

}  // namespace kvt::conn
