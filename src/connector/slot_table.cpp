#include "connector/slot_table.hpp"

#include "common/error.hpp"

namespace kvt::conn {

namespace {
// Debian's abseil has its own string_view.
absl::string_view key(std::string_view id) { return {id.data(), id.size()}; }
}  // namespace

Slot *SlotTable::get(std::string_view id) const {
  auto it = slots_.find(key(id));
  return it == slots_.end() ? nullptr : it->second.get();
}

Slot *SlotTable::find(const char *fn, std::string_view id, kvt_status *st) const {
  Slot *s = get(id);
  *st = s ? KVT_OK
          : fail(KVT_ERR_NOT_FOUND, "%s: unknown request id '%s' (never seen, or finished)", fn,
                 std::string(id).c_str());
  return s;
}

Slot &SlotTable::add(std::string id, TokenSeq seq) {
  auto fresh = std::make_unique<Slot>(std::move(id), std::move(seq));
  Slot &s = *fresh;
  slots_.emplace(s.id, std::move(fresh));
  return s;
}

void SlotTable::retire(Slot &s) {
  if (done_.size() >= kKeepFinished) {
    done_.erase(done_order_.front());
    done_order_.pop_front();
  }
  done_order_.push_back(s.id);
  done_[s.id] = std::move(s.history);
  slots_.erase(s.id);
}

kvt_status SlotTable::state(uint32_t *state, const std::vector<uint32_t> **history,
                            std::string_view id) const {
  if (const Slot *s = get(id)) {
    *state = s->state;
    *history = &s->history;
    return KVT_OK;
  }
  if (auto it = done_.find(key(id)); it != done_.end()) {
    *state = KVT_SLOT_FINISHED;
    *history = &it->second;
    return KVT_OK;
  }
  kvt_status st;
  find("kvt_connector_slot_state", id, &st);
  return st;
}

}  // namespace kvt::conn
