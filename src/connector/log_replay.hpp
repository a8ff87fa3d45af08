// kvt_event_log_replay: an event log applied to a fresh manager and checked as it goes.
// The registry is rebuilt in the manager's tiers from the BLOCK_* events; the slots and the
// batches are rebuilt here from the SLOT and CANDIDATE events, each transition checked
// against seed 004's table (slot.hpp), each promoted batch required to end exactly once.
#pragma once

#include <absl/container/flat_hash_map.h>
#include <absl/container/flat_hash_set.h>

#include <cstdint>
#include <string>

#include "kvtier.h"

namespace kvt {
class Manager;
}

namespace kvt::conn {

class LogReplay {
 public:
  explicit LogReplay(Manager *fresh) : m_(fresh) {}  // fresh may be null: checks only
  void apply(const kvt_obs_event &e);
  // The counts so far; the first violation, if any, in *first.
  void result(kvt_log_replay *out, std::string *first) const;
  // Counts a violation; the first one's message, after "event #N: " (the last event
  // applied), is kept.
  [[gnu::format(printf, 2, 3)]] void violation(const char *fmt, ...);

  // The state the events describe: live slots and their states, hashes by tier, counts of
  // transitions [from][to].
  const absl::flat_hash_map<std::string, uint32_t> &slots() const { return slots_; }
  const absl::flat_hash_set<uint64_t> &registered(int tier) const { return registered_[tier]; }
  const uint64_t (&transitions() const)[11][11] { return transitions_; }
  uint64_t events() const { return events_; }
  size_t open_batches() const { return batches_.size(); }

 private:
  void stored(uint32_t tier, uint64_t hash, uint64_t parent);
  void removed(uint32_t tier, uint64_t hash);

  Manager *m_;
  uint64_t events_ = 0, last_seq_ = 0, violations_ = 0, finished_ = 0, loaded_ = 0;
  std::string first_;
  uint64_t transitions_[11][11] = {};
  absl::flat_hash_map<std::string, uint32_t> slots_;   // live slots: their state
  absl::flat_hash_set<uint64_t> batches_;              // promoted, not yet ended
  absl::flat_hash_set<uint64_t> registered_[4];        // by tier
};

}  // namespace kvt::conn
