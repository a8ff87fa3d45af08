// The scheduler half's slot table: a slot per live request id, and the state histories of
// the last kKeepFinished finished ones, so that kvt_connector_slot_state still answers for
// a request shortly after it ends.
#pragma once

#include <absl/container/flat_hash_map.h>

#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "connector/slot.hpp"
#include "kvtier.h"

namespace kvt::conn {

class SlotTable {
 public:
  static constexpr size_t kKeepFinished = 4096;

  Slot *get(std::string_view id) const;  // the live slot, or null
  // The live slot, or null with KVT_ERR_NOT_FOUND and a message naming fn.
  Slot *find(const char *fn, std::string_view id, kvt_status *st) const;
  Slot &add(std::string id, TokenSeq seq);
  // s leaves the table; its history stays, the oldest kept one forgotten past kKeepFinished.
  void retire(Slot &s);
  // A live or recently finished request's state and history.
  kvt_status state(uint32_t *state, const std::vector<uint32_t> **history,
                   std::string_view id) const;
  // f(Slot &) for every live slot, in no particular order; f may not add or retire slots.
  template <class F>
  void each(F &&f) const {
    for (const auto &[id, s] : slots_) f(*s);
  }

 private:
  absl::flat_hash_map<std::string, std::unique_ptr<Slot>> slots_;
  absl::flat_hash_map<std::string, std::vector<uint32_t>> done_;
  std::deque<std::string> done_order_;
};

}  // namespace kvt::conn
