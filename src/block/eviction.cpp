#include "block/eviction.hpp"

#include <algorithm>

#include "common/error.hpp"
#include "memory/mapping.hpp"

namespace kvt {

namespace {
unsigned long long ull(uint64_t v) { return v; }
bool is_registered(const Slot &sl) {
  return State(sl.state) == State::Registered || State(sl.state) == State::Inactive;
}
}  // namespace

Evictor::Evictor(Slot *const *slots, kvt_tier tier, uint64_t capacity, EvictionConfig cfg)
    : slots_(slots), tier_(tier), capacity_(capacity),
      pin_limit_(capacity * cfg.max_pinned_percent / 100),
      max_pinned_percent_(cfg.max_pinned_percent) {
  if (cfg.policy == KVT_EVICT_S3FIFO) {
    ghost_ = std::make_unique<Ghost>(capacity - capacity / 10);  // as many as main holds
    prepare_marks();
  }
}

Evictor::~Evictor() {
  if (marks_) unmap(marks_, capacity_);
}

uint64_t Evictor::bytes() const noexcept {
  return (marks_ ? capacity_ : 0) + (ghost_ ? ghost_->bytes() : 0) +
         prio_.capacity() * (sizeof(std::pair<uint32_t, int32_t>) + 1) +
         levels_.size() * (sizeof(Level) + 48);
}

// ---- where a block stands ----

bool Evictor::listed(uint32_t s) const noexcept {
  return State((*slots_)[s].state) == State::Inactive && !(marks_ && (marks_[s] & kPinned));
}

int32_t Evictor::priority(uint32_t s) const noexcept {
  return marks_ && (marks_[s] & kPrio) ? prio_.find(s)->second : 0;
}

Level &Evictor::level(int32_t priority) noexcept {
  return priority == 0 ? level0_ : levels_.find(priority)->second;
}

const Level *Evictor::level_if(int32_t priority) const noexcept {
  if (priority == 0) return &level0_;
  auto it = levels_.find(priority);
  return it == levels_.end() ? nullptr : &it->second;
}

Level &Evictor::lowest() noexcept {
  for (auto &[p, l] : levels_) {
    if (p > 0 && level0_.size() > 0) return level0_;
    if (l.size() > 0) return l;
  }
  return level0_;
}

// ---- the lifecycle hooks, beyond the plain case ----

void Evictor::taken_marked(uint32_t s, bool was_inactive) noexcept {
  uint8_t &m = marks_[s];
  if (was_inactive && !(m & kPinned)) {
    level(priority(s)).q[queue_of(m)].unlink(*slots_, s);
    --n_evictable_;
  }
  if (ghost_ && freq(m) < 3) m += 1 << kFreqShift;
}

void Evictor::released_marked(uint32_t s) noexcept {
  uint8_t &m = marks_[s];
  if (m & kPinned) return;
  if (ghost_) s3_released(m);
  level(priority(s)).q[queue_of(m)].push_back(*slots_, s);
  ++n_evictable_;
}

void Evictor::dropped(uint32_t s) noexcept {
  if (plain()) {
    if (State((*slots_)[s].state) == State::Inactive) {
      level0_.q[0].unlink(*slots_, s);
      --n_evictable_;
    }
    return;
  }
  if (listed(s)) {
    level(priority(s)).q[queue_of(marks_[s])].unlink(*slots_, s);
    --n_evictable_;
  }
  forget(s);
}

void Evictor::forget(uint32_t s) noexcept {
  uint8_t m = marks_[s];
  if (m & kPinned) --n_pinned_;
  if (m & kPrio) {
    auto it = prio_.find(s);
    auto lv = levels_.find(it->second);
    prio_.erase(it);
    if (--lv->second.members == 0) levels_.erase(lv);  // its queues are empty: s was the last
  }
  marks_[s] = 0;
}

uint32_t Evictor::victim() noexcept {
  Level &l = levels_.empty() ? level0_ : lowest();
  uint32_t s = ghost_ ? s3_victim(l) : l.q[0].pop_front(*slots_);
  --n_evictable_;
  if (!plain()) forget(s);
  return s;
}

// Levels drain lowest first, each in its policy's order.
std::vector<uint32_t> Evictor::order(size_t max) const {
  std::vector<uint32_t> out;
  out.reserve(std::min<uint64_t>(max, n_evictable_));
  for (auto &[p, l] : levels_)
    if (p < 0) order_level(l, max, out);
  order_level(level0_, max, out);
  for (auto &[p, l] : levels_)
    if (p > 0) order_level(l, max, out);
  return out;
}

void Evictor::order_level(const Level &l, size_t max, std::vector<uint32_t> &out) const {
  if (ghost_) return s3_order(l, max, out);
  for (uint32_t s = l.q[0].head; s != kNilSlot && out.size() < max; s = (*slots_)[s].next)
    out.push_back(s);
}

// ---- pins ----

void Evictor::prepare_marks() {
  if (!marks_) marks_ = static_cast<uint8_t *>(map_zeroed(capacity_));
}

bool Evictor::stage_pin(uint32_t s) noexcept {
  if (marks_[s] & (kPinned | kStaged)) return false;
  marks_[s] |= kStaged;
  return true;
}

kvt_status Evictor::admit_pins(uint64_t staged) const noexcept {
  if (n_pinned_ + staged <= pin_limit_) return KVT_OK;
  return fail(KVT_ERR_NO_SPACE,
              "G%d: pinning %llu more blocks would pin %llu, past max_pinned_percent (%u%% of "
              "%llu blocks: %llu)",
              int(tier_), ull(staged), ull(n_pinned_ + staged), max_pinned_percent_,
              ull(capacity_), ull(pin_limit_));
}

void Evictor::unstage_pin(uint32_t s) noexcept { marks_[s] &= uint8_t(~kStaged); }

void Evictor::commit_pin(uint32_t s) noexcept {
  uint8_t &m = marks_[s];
  if (!(m & kStaged)) return;  // pinned before, or listed twice
  if (listed(s)) {
    level(priority(s)).q[queue_of(m)].unlink(*slots_, s);
    --n_evictable_;
  }
  m = uint8_t((m & ~kStaged) | kPinned);
  ++n_pinned_;
}

void Evictor::unpin(uint32_t s) noexcept {
  if (!marks_ || !(marks_[s] & kPinned)) return;
  marks_[s] &= uint8_t(~kPinned);
  --n_pinned_;
  if (State((*slots_)[s].state) == State::Inactive) released(s);  // as if released now
}

// ---- priorities ----

void Evictor::prepare_priority(int32_t priority, size_t n) {
  if (priority == 0) return;
  prepare_marks();
  prio_.reserve(prio_.size() + n);
  levels_.try_emplace(priority);
}

void Evictor::unprepare_priority(int32_t priority) noexcept {
  if (auto it = levels_.find(priority); it != levels_.end() && it->second.members == 0)
    levels_.erase(it);
}

// An evictable block changing priority goes to the most recent end of its new level.
void Evictor::set_priority(uint32_t s, int32_t p) noexcept {
  int32_t old = priority(s);
  if (old == p) return;
  const bool in = listed(s);
  const int q = queue_of(marks_[s]);
  if (in) level(old).q[q].unlink(*slots_, s);
  if (old != 0) {
    auto lv = levels_.find(old);
    prio_.erase(s);
    if (--lv->second.members == 0) levels_.erase(lv);
    marks_[s] &= uint8_t(~kPrio);
  }
  if (p != 0) {
    prio_.emplace(s, p);  // reserved by prepare_priority
    ++levels_.find(p)->second.members;
    marks_[s] |= kPrio;
  }
  if (in) level(p).q[q].push_back(*slots_, s);
}

// ---- invariants ----

kvt_status Evictor::check(uint32_t high_water, uint64_t inactive) const {
  auto bad = [&](const char *what, uint64_t a, uint64_t b) {
    return fail(KVT_ERR_INTERNAL, "G%d eviction invariant violated: %s (%llu vs %llu)",
                int(tier_), what, ull(a), ull(b));
  };
  const Slot *slots = *slots_;
  uint64_t listed_total = 0;
  auto walk = [&](const SlotQueue &q, int32_t p, int qi) {
    uint64_t n = 0;
    uint32_t last = kNilSlot;
    for (uint32_t s = q.head; s != kNilSlot; last = s, s = slots[s].next) {
      if (s >= high_water) return bad("an eviction queue links a slot never used", s, 0);
      if (slots[s].prev != last) return bad("eviction queue links", s, slots[s].prev);
      if (State(slots[s].state) != State::Inactive)
        return bad("an eviction queue links a block not inactive", s, slots[s].state);
      uint8_t m = marks_ ? marks_[s] : 0;
      if (m & kPinned) return bad("a pinned block is evictable", s, m);
      if (priority(s) != p) return bad("a block in another priority's queue", s, uint64_t(p));
      if (queue_of(m) != qi) return bad("a block in the wrong S3-FIFO queue", s, qi);
      if (++n > q.size) return bad("an eviction queue longer than its count", n, q.size);
    }
    if (q.tail != last) return bad("eviction queue tail", q.tail, last);
    if (n != q.size) return bad("eviction queue length", n, q.size);
    listed_total += n;
    return KVT_OK;
  };
  for (int qi = 0; qi < 2; ++qi)
    if (kvt_status st = walk(level0_.q[qi], 0, qi); st != KVT_OK) return st;
  for (auto &[p, l] : levels_) {
    if (p == 0 || l.members == 0) return bad("a priority level without blocks", uint64_t(p), 0);
    for (int qi = 0; qi < 2; ++qi)
      if (kvt_status st = walk(l.q[qi], p, qi); st != KVT_OK) return st;
  }
  if (listed_total != n_evictable_) return bad("evictable count", listed_total, n_evictable_);

  uint64_t pinned = 0, pinned_inactive = 0;
  absl::flat_hash_map<int32_t, uint64_t> members;
  if (marks_) {
    for (uint32_t s = 0; s < high_water; ++s) {
      const uint8_t m = marks_[s];
      if (m == 0) continue;
      if (m & kStaged) return bad("a pin left staged", s, m);
      if (!is_registered(slots[s])) return bad("marks on a block not registered", s, m);
      if (!ghost_ && (m & (kMain | kFreqMask))) return bad("S3-FIFO marks under LRU", s, m);
      if (m & kPinned) {
        ++pinned;
        if (State(slots[s].state) == State::Inactive) ++pinned_inactive;
      }
      if (m & kPrio) {
        auto it = prio_.find(s);
        if (it == prio_.end() || it->second == 0) return bad("a priority mark without one", s, 0);
        ++members[it->second];
      }
    }
  }
  if (pinned != n_pinned_) return bad("pinned count", pinned, n_pinned_);
  if (n_pinned_ > pin_limit_) return bad("pinned past max_pinned_percent", n_pinned_, pin_limit_);
  if (inactive != n_evictable_ + pinned_inactive)
    return bad("inactive blocks neither evictable nor pinned", inactive,
               n_evictable_ + pinned_inactive);
  uint64_t with_prio = 0;
  for (auto &[p, n] : members) {
    with_prio += n;
    const Level *l = level_if(p);
    if (l == nullptr || l->members != n) return bad("level members", n, l ? l->members : 0);
  }
  if (with_prio != prio_.size()) return bad("priorities held", with_prio, prio_.size());
  if (members.size() != levels_.size()) return bad("priority levels", members.size(),
                                                   levels_.size());
  return KVT_OK;
}

}  // namespace kvt
