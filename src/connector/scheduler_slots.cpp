// The scheduler half's side of its slots (the table itself is slot_table.hpp): their
// transitions, each an observe SLOT event and a breakpoint's stop, the G1 blocks each slot
// writes, and the snapshot that inspection reads.
#include "connector/scheduler.hpp"

#include <algorithm>
#include <cstring>

#include "common/error.hpp"
#include "common/names.hpp"
#include "manager/manager.hpp"

namespace kvt::conn {

namespace {
// The first block a request computed up to `computed` still reads: vLLM frees the blocks
// wholly before computed - sliding_window + 1 (it counts only processed tokens, never more
// than computed, so this frees no block vLLM keeps).
size_t window_start(uint64_t computed, uint32_t window, uint32_t page) {
  return computed + 1 > window ? size_t((computed + 1 - window) / page) : 0;
}
}  // namespace

kvt_status Scheduler::transition_error(const char *fn, const Slot &s, SlotState to) const {
  return fail(KVT_ERR_STATE, "%s: request '%s' is %s, which cannot become %s", fn,
              s.id.c_str(), slot_state_name(s.state), slot_state_name(to));
}

void Scheduler::move(Slot &s, SlotState to) {
  ++stats_.transitions[s.state][to];
  const uint32_t prev = s.state;
  slot_event(s, prev, to);
  if (s.state != to) s.to(to);
  stop_point(s.id, prev, to);
}

void Scheduler::slot_event(const Slot &s, uint32_t prev, uint32_t to) {
  if (kObserve && hooks_.transition)
    hooks_.transition(hooks_.user, s.id.c_str(), prev, to, trigger_);
  if (!m_.bus().on()) return;
  ObsEvent e = obs_event(KVT_OBS_SLOT, s.id);
  e.prev = prev;
  e.state = to;
  e.trigger = trigger_;
  e.tokens = s.seq.tokens();
  e.computed = s.computed;
  m_.bus().emit(e);
}

// s now writes g1 (none: the engine's null block).
void Scheduler::claim(Slot &s, uint32_t g1) {
  if (g1 == KVT_BLOCK_ID_NONE) return;
  writer_[g1] = &s;
  stores_.reuse(s, g1);
}

void Scheduler::unclaim(Slot &s) {
  for (uint32_t b : s.blocks)
    if (b != KVT_BLOCK_ID_NONE && writer_[b] == &s) writer_[b] = nullptr;
}

// Block ids the call hands to s for writing: in range, not written by another live request,
// not given twice. Marks them with stamp for the duplicate check.
kvt_status Scheduler::check_blocks(const char *fn, const Slot &s, const uint32_t *ids, size_t n,
                                   uint32_t stamp) {
  for (size_t i = 0; i < n; ++i) {
    uint32_t b = ids[i];
    if (b == KVT_BLOCK_ID_NONE) continue;
    if (b >= writer_.size())
      return fail(KVT_ERR_INVALID_ARGUMENT,
                  "%s: request '%s': block id %u is out of range (num_gpu_blocks is %zu)", fn,
                  s.id.c_str(), b, writer_.size());
    if (writer_[b] != nullptr && writer_[b] != &s && !left_window(*writer_[b], b))
      return fail(KVT_ERR_INVALID_ARGUMENT,
                  "%s: request '%s': block id %u is written by request '%s'", fn, s.id.c_str(),
                  b, writer_[b]->id.c_str());
    if (stamp_[b] == stamp)
      return fail(KVT_ERR_INVALID_ARGUMENT, "%s: request '%s': block id %u is given twice", fn,
                  s.id.c_str(), b);
    stamp_[b] = stamp;
  }
  return KVT_OK;
}

void Scheduler::append_tokens(Slot &s, const uint32_t *tokens, size_t n) {
  KvSink *kv = m_.kv_sink();
  if (kv == nullptr) return s.seq.append(tokens, n);
  // The filled blocks' tokens: the partial block's, then the new ones.
  std::vector<uint32_t> filled = s.seq.partial();
  filled.insert(filled.end(), tokens, tokens + n);
  const size_t before = s.seq.blocks();
  s.seq.append(tokens, n);
  kv->note_tokens(s.seq.seq_hashes().data() + before, s.seq.blocks() - before, filled.data());
}

// FINISHING -> FINISHED: the slot goes; its history stays for a while.
void Scheduler::finish(Slot &s) {
  move(s, KVT_SLOT_FINISHED);
  slots_.retire(s);
}

void Scheduler::to_waiting(Slot &s) {
  loads_.drop_staged(s);
  loads_.drop_planned(s);
  unclaim(s);
  s.blocks.clear();
  s.computed = 0;
  s.write_from = 0;
  s.store_next = 0;  // its blocks may be stored again: plan_store skips what is present
  s.released_below = 0;
  s.reach = 0;
  ++stats_.preemptions;
  move(s, KVT_SLOT_PREEMPTED);
}

// vLLM frees a sliding window's blocks as they leave it, unannounced, when it allocates for
// the request (it may then hand them to any request in the same schedule): t no longer
// needs b when b lies before the window of the furthest token t was scheduled to reach.
bool Scheduler::left_window(const Slot &t, uint32_t b) const {
  if (!window_blocks_) return false;
  size_t end = std::min(window_start(t.reach, cfg_.sliding_window, page_), t.blocks.size());
  for (size_t j = t.released_below; j < end; ++j)
    if (t.blocks[j] == b) return true;
  return false;
}

// s's blocks that left the window are the engine's again, and never stored from now on:
// another request may write them in this very step.
void Scheduler::release_window(Slot &s, uint64_t computed) {
  size_t end = std::min(window_start(computed, cfg_.sliding_window, page_), s.blocks.size());
  for (size_t j = s.released_below; j < end; ++j)
    if (s.blocks[j] != KVT_BLOCK_ID_NONE && writer_[s.blocks[j]] == &s)
      writer_[s.blocks[j]] = nullptr;
  s.released_below = std::max(s.released_below, end);
  s.store_next = std::max(s.store_next, end);
}

kvt_status Scheduler::slot_state(uint32_t *state, const std::vector<uint32_t> **history,
                                 std::string_view id) const {
  return slots_.state(state, history, id);
}

void Scheduler::stats(kvt_connector_stats *out) const { *out = stats_; }

Snapshot Scheduler::snapshot() const {
  Snapshot out;
  const auto now = std::chrono::steady_clock::now();
  slots_.each([&](const Slot &s) {
    kvt_slot_info i{};
    copy_id(i.req_id, s.id);
    i.state = s.state;
    i.age_ns = uint64_t(
        std::chrono::duration_cast<std::chrono::nanoseconds>(now - s.born).count());
    i.tokens = s.seq.tokens();
    i.computed = s.computed;
    i.blocks = s.blocks.size();
    i.batches = s.batches;
    out.slots.push_back(i);
  });
  loads_.batches(&out.batches);
  stores_.batches(&out.batches);
  auto by_id = [](const auto &a, const auto &b) { return std::strcmp(a.req_id, b.req_id) < 0; };
  std::sort(out.slots.begin(), out.slots.end(), by_id);
  std::sort(out.batches.begin(), out.batches.end(),
            [](const kvt_batch_info &a, const kvt_batch_info &b) { return a.batch < b.batch; });
  out.stats = stats_;
  return out;
}

}  // namespace kvt::conn
