#include "block/tier.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>

#include "common/error.hpp"
#include "memory/mapping.hpp"

namespace kvt {

struct Tier::TokenBuf {
  uint64_t salt_hash, parent;
  uint32_t count = 0;
  std::unique_ptr<uint32_t[]> tokens;
};

namespace {
const char *state_name(State s) {
  switch (s) {
    case State::Free: return "free";
    case State::Empty: return "Empty";
    case State::Partial: return "Partial";
    case State::Ready: return "ReadyForScheduling";
    case State::Inflight: return "Inflight";
    case State::Complete: return "Complete";
    case State::Registered: return "Registered";
    case State::Inactive: return "Inactive";
    case State::Removed: return "removed (its stored copy was corrupt)";
    case State::Retired: return "retired";
  }
  return "?";
}
bool is_mutable(State s) { return s >= State::Empty && s <= State::Complete; }
bool is_registered(State s) { return s == State::Registered || s == State::Inactive; }
bool is_live(State s) { return s != State::Free && s != State::Retired; }
unsigned long long ull(uint64_t v) { return v; }
}  // namespace

Tier::Tier(kvt_tier id, uint32_t tag, uint64_t capacity, uint32_t page_size,
           uint32_t first_gen, EvictionConfig eviction)
    : id_(id), tag_(tag), capacity_(capacity), page_size_(page_size), first_gen_(first_gen),
      slots_(static_cast<Slot *>(map_zeroed(capacity * sizeof(Slot)))),
      ev_(&slots_, id, capacity, eviction), n_free_(capacity) {
  // Sized once so that registering never rehashes or allocates on the hot path.
  registry_.reserve(capacity);
  pending_events_.reserve(64);
}

Tier::~Tier() { unmap(slots_, capacity_ * sizeof(Slot)); }

kvt_block Tier::handle_of(uint32_t s) const noexcept {
  return handle::make(tag_, id_, s, slots_[s].gen);
}

kvt_status Tier::resolve(kvt_block b, uint32_t *out) const noexcept {
  uint32_t s = handle::slot(b);
  if (handle::tag(b) != tag_)
    return fail(KVT_ERR_INVALID_HANDLE, "block handle 0x%llx belongs to no block of this manager",
                ull(b));
  if (handle::tier(b) != unsigned(id_))
    return fail(KVT_ERR_INVALID_ARGUMENT, "block 0x%llx is in G%u, not G%d", ull(b),
                handle::tier(b), int(id_));
  if (s >= high_water_ || slots_[s].gen != handle::gen(b) || !is_live(State(slots_[s].state)))
    return fail(KVT_ERR_INVALID_HANDLE,
                "block handle 0x%llx is stale or forged: its block was released, evicted or "
                "never allocated",
                ull(b));
  *out = s;
  return KVT_OK;
}

kvt_status Tier::expect(kvt_block b, uint32_t *out, State want, const char *op) const noexcept {
  if (kvt_status st = resolve(b, out); st != KVT_OK) return st;
  State have = State(slots_[*out].state);
  if (have != want)
    return fail(KVT_ERR_STATE, "%s needs a block in state %s; block 0x%llx is %s", op,
                state_name(want), ull(b), state_name(have));
  return KVT_OK;
}

// ---- free list and evictable set ----

uint32_t Tier::take_free_slot() noexcept {
  uint32_t s = free_head_;
  if (s != kNil) {
    free_head_ = slots_[s].next;
  } else {
    s = high_water_++;
    slots_[s].gen = first_gen_;
  }
  --n_free_;
  return s;
}

void Tier::free_slot(uint32_t s) noexcept {
  Slot &sl = slots_[s];
  if (State(sl.state) != State::Empty) tokens_.erase(s);
  if (sl.gen == handle::kLastGen) return retire(s);
  sl.state = uint32_t(State::Free);
  sl.refs = 0;
  sl.gen = sl.gen + 1;  // every old handle to this slot goes stale
  sl.next = free_head_;
  free_head_ = s;
  ++n_free_;
  --n_active_;
}

// A new generation would wrap to one that old handles may still hold: the slot leaves the
// pool instead, so that no stale handle ever becomes valid again.
void Tier::retire(uint32_t s) noexcept {
  Slot &sl = slots_[s];
  sl.state = uint32_t(State::Retired);
  sl.refs = 0;
  --n_active_;
  ++n_retired_;
}

uint32_t Tier::evict_one() noexcept {
  uint32_t s = ev_.victim();
  Slot &sl = slots_[s];
  registry_.erase(sl.seq_hash);
  note_event(KVT_EVENT_BLOCK_REMOVED, sl.seq_hash, 0);
  sl.gen = sl.gen + 1;  // below kLastGen: a slot at it never becomes inactive
  --n_inactive_;
  ++evictions_;
  return s;
}

void Tier::note_event(kvt_event_type type, uint64_t hash, uint64_t parent) noexcept {
  if (!events_ && !sink_ && !obs_) return;
  kvt_event e{};
  e.type = type;
  e.tier = id_;
  e.hash = hash;
  e.parent_hash = parent;
  // Capacity was reserved before the operation changed anything; an allocation failure
  // here could only lose the event, which the queue would then count as dropped.
  if (pending_events_.size() < pending_events_.capacity()) pending_events_.push_back(e);
}

void Tier::publish_events_locked() noexcept {
  if (pending_events_.empty()) return;
  if (events_) events_->push(pending_events_.data(), pending_events_.size());
  if (sink_) sink_->publish(pending_events_.data(), pending_events_.size());
  if (obs_ && obs_->on()) obs_->emit_tier_events(pending_events_.data(), pending_events_.size());
  pending_events_.clear();
}

void Tier::make_inactive(uint32_t s) noexcept {
  slots_[s].state = uint32_t(State::Inactive);
  ev_.released(s);
  --n_active_;
  ++n_inactive_;
}

void Tier::pin(uint32_t s) noexcept {
  Slot &sl = slots_[s];
  const bool inactive = State(sl.state) == State::Inactive;
  ev_.taken(s, inactive);
  if (inactive) {
    sl.state = uint32_t(State::Registered);
    --n_inactive_;
    ++n_active_;
  }
  ++sl.refs;
}

// ---- allocation, references, registry ----

kvt_status Tier::alloc(kvt_block *out, size_t n, Holder h) {
  Locked lock(*this);
  if (n > n_free_ + ev_.evictable())
    return fail(KVT_ERR_NO_SPACE,
                "G%d cannot supply %zu blocks: %llu free and %llu evictable of %llu (%llu in "
                "use, %llu pinned)",
                int(id_), n, ull(n_free_), ull(ev_.evictable()), ull(capacity_), ull(n_active_),
                ull(ev_.pinned()));
  pending_events_.reserve(n > n_free_ ? n - n_free_ : 0);  // may throw: nothing changed yet
  for (size_t i = 0; i < n; ++i) {
    uint32_t s = n_free_ > 0 ? take_free_slot() : evict_one();
    Slot &sl = slots_[s];
    sl.state = uint32_t(State::Empty);
    sl.refs = 1;
    sl.seq_hash = sl.parent_hash = 0;
    ++n_active_;
    out[i] = handle_of(s);
  }
  allocs_ += n;
  refs_[int(h)] += n;
  return KVT_OK;
}

kvt_status Tier::retain(kvt_block b, Holder h) {
  Locked lock(*this);
  uint32_t s = 0;
  if (kvt_status st = resolve(b, &s); st != KVT_OK) return st;
  if (!is_registered(State(slots_[s].state)))
    return fail(KVT_ERR_STATE, "retain needs a registered block; block 0x%llx is %s", ull(b),
                state_name(State(slots_[s].state)));
  pin(s);
  ++refs_[int(h)];
  return KVT_OK;
}

kvt_status Tier::registered_locked(kvt_block b, const char *fn, size_t i,
                                   uint32_t *s) const noexcept {
  if (kvt_status st = resolve(b, s); st != KVT_OK) return st;
  if (!is_registered(State(slots_[*s].state)))
    return fail(KVT_ERR_STATE, "%s needs registered blocks; blocks[%zu] = 0x%llx is %s", fn, i,
                ull(b), state_name(State(slots_[*s].state)));
  return KVT_OK;
}

kvt_status Tier::take_ref_locked(kvt_block b, Holder h) {
  uint32_t s = 0;
  if (kvt_status st = resolve(b, &s); st != KVT_OK) return st;
  if (slots_[s].refs == 0)
    return fail(KVT_ERR_STATE, "block 0x%llx holds no reference to release (it is %s)",
                ull(b), state_name(State(slots_[s].state)));
  --slots_[s].refs;
  --refs_[int(h)];
  return KVT_OK;
}

void Tier::undo_take_ref_locked(kvt_block b, Holder h) {
  ++slots_[handle::slot(b)].refs;
  ++refs_[int(h)];
}

void Tier::settle_locked(kvt_block b) {
  uint32_t s = handle::slot(b);
  Slot &sl = slots_[s];
  // A handle listed twice is settled once: by then its slot is Free or Inactive.
  if (sl.refs != 0 || sl.gen != handle::gen(b)) return;
  State st = State(sl.state);
  if (is_mutable(st) || st == State::Removed) {
    free_slot(s);
  } else if (st == State::Registered && sl.gen == handle::kLastGen) {
    // It could not be evicted into a new generation: it leaves the registry now.
    ev_.dropped(s);
    registry_.erase(sl.seq_hash);
    note_event(KVT_EVENT_BLOCK_REMOVED, sl.seq_hash, 0);
    retire(s);
    publish_events_locked();
  } else if (st == State::Registered) {
    make_inactive(s);
  }
}

kvt_status Tier::commit_registration(kvt_block *out, uint32_t s, uint64_t seq,
                                     uint64_t parent) {
  Slot &sl = slots_[s];
  sl.seq_hash = seq;  // a mutable block's hash is free to set; the registry reads it
  if (uint32_t existing = registry_.insert(s); existing != s) {
    // Dedup (seed 002 box_block): the caller gets the existing block, theirs is freed.
    pin(existing);
    free_slot(s);
    ++dedups_;
    *out = handle_of(existing);
    return KVT_OK;
  }
  if (State(sl.state) != State::Empty) {
    if (sink_)
      if (auto it = tokens_.find(s); it != tokens_.end())  // the token path
        sink_->note_tokens(&seq, 1, it->second->tokens.get());
    tokens_.erase(s);
  }
  sl.state = uint32_t(State::Registered);
  sl.parent_hash = parent;
  ev_.registered(s, seq);
  ++registrations_;
  note_event(KVT_EVENT_BLOCK_STORED, seq, parent);
  *out = handle_of(s);
  return KVT_OK;
}

uint64_t Tier::recover(const Recovered *blocks, size_t n, std::vector<Recovered> *registered) {
  Locked lock(*this);
  if (allocs_ != 0 || high_water_ != 0) return 0;
  uint32_t top = 0;  // one past the highest slot recovered
  for (size_t i = 0; i < n; ++i) {
    const Recovered &r = blocks[i];
    if (r.slot >= capacity_ || State(slots_[r.slot].state) != State::Free) continue;
    Slot &sl = slots_[r.slot];
    sl.seq_hash = r.seq_hash;
    if (registry_.insert(r.slot) != r.slot) {
      sl.seq_hash = 0;
      continue;
    }
    sl.parent_hash = r.parent;
    sl.gen = first_gen_;
    sl.state = uint32_t(State::Inactive);
    ev_.registered(r.slot, r.seq_hash);
    ev_.released(r.slot);
    ++n_inactive_;
    ++recovered_;
    top = std::max(top, r.slot + 1);
    if (registered) registered->push_back(r);
  }
  // The slots below the highest one recovered that hold nothing go on the free list, the
  // lowest first, as if used and freed.
  high_water_ = top;
  for (uint32_t s = top; s-- > 0;) {
    Slot &sl = slots_[s];
    if (State(sl.state) != State::Free) continue;
    sl.gen = first_gen_;
    sl.next = free_head_;
    free_head_ = s;
  }
  n_free_ -= recovered_;
  return recovered_;
}

kvt_status Tier::register_hash(kvt_block *out, kvt_block b, uint64_t seq, uint64_t parent) {
  Locked lock(*this);
  uint32_t s = 0;
  if (kvt_status st = resolve(b, &s); st != KVT_OK) return st;
  State have = State(slots_[s].state);
  if (have != State::Empty && have != State::Complete)
    return fail(KVT_ERR_STATE,
                "register_hash needs a filled block in state Empty or Complete; block 0x%llx "
                "is %s",
                ull(b), state_name(have));
  if (slots_[s].refs > 1)  // the caller's and the pipeline's: an onboard writes it
    return fail(KVT_ERR_STATE,
                "register_hash: block 0x%llx is the destination of an onboard in flight", ull(b));
  return commit_registration(out, s, seq, parent);
}

kvt_status Tier::register_chain(kvt_block *out, const kvt_block *blocks,
                                const uint64_t *seq_hashes, size_t n, uint64_t parent) {
  Locked lock(*this);
  pending_events_.reserve(n);  // may throw: nothing changed yet
  // The slots are read before any result is written: out may overlap blocks, even shifted,
  // and writing out[i] must not change which block i + 1 is.
  std::vector<uint32_t> slots(n);
  // Validate everything first. Counting one extra reference per listed block exposes a block
  // listed twice (a mutable block holds one, or two while an onboard writes it); every
  // extra count is taken back before anything is registered.
  size_t counted = 0;
  kvt_status st = KVT_OK;
  for (size_t i = 0; i < n && st == KVT_OK; ++i) {
    uint32_t s = 0;
    if ((st = resolve(blocks[i], &s)) != KVT_OK) break;
    slots[i] = s;
    State have = State(slots_[s].state);
    if (have != State::Empty && have != State::Complete) {
      st = fail(KVT_ERR_STATE,
                "register_hashes needs filled blocks in state Empty or Complete; blocks[%zu] "
                "= 0x%llx is %s",
                i, ull(blocks[i]), state_name(have));
      break;
    }
    ++counted;
    if (++slots_[s].refs > 2)
      st = fail(KVT_ERR_INVALID_ARGUMENT,
                "register_hashes: blocks[%zu] = 0x%llx is listed twice or is being onboarded",
                i, ull(blocks[i]));
  }
  for (size_t j = 0; j < counted; ++j) --slots_[slots[j]].refs;
  if (st != KVT_OK) return st;
  // seq_hashes is the caller's and out may overlap it too: keep the parent in hand.
  for (size_t i = 0; i < n; ++i) {
    uint64_t seq = seq_hashes[i];
    commit_registration(out + i, slots[i], seq, parent);
    parent = seq;
  }
  return KVT_OK;
}

kvt_status Tier::match(size_t *out_n, kvt_block *out, const uint64_t *hashes, size_t n) {
  Locked lock(*this);
  // In a large tier each lookup misses the caches three times, one after the other: the
  // registry table, then the slot it names, then the slot's neighbours on the inactive list,
  // which pinning unlinks. So a group of lookups goes through each of those steps in turn,
  // with the misses of one step overlapping, before the next step needs them.
  constexpr size_t kGroup = 32;
  uint32_t cand[kGroup];
  size_t i = 0;
  for (bool more = true; more && i < n;) {
    const size_t g = std::min(kGroup, n - i);
    for (size_t j = 0; j < g; ++j) registry_.prefetch(hashes[i + j]);
    size_t found = 0;
    for (; found < g; ++found) {  // the table alone: no slot read yet
      if ((cand[found] = registry_.candidate(hashes[i + found])) == kNil) break;
      __builtin_prefetch(&slots_[cand[found]]);
    }
    for (size_t j = 0; j < found; ++j) {  // confirm each candidate; load its neighbours
      if (slots_[cand[j]].seq_hash != hashes[i + j] &&
          (cand[j] = registry_.find(hashes[i + j])) == kNil) {
        found = j;
        break;
      }
      const Slot &sl = slots_[cand[j]];
      if (State(sl.state) == State::Inactive) {
        if (sl.prev != kNil) __builtin_prefetch(&slots_[sl.prev], 1);
        if (sl.next != kNil) __builtin_prefetch(&slots_[sl.next], 1);
      }
    }
    for (size_t j = 0; j < found; ++j) {
      pin(cand[j]);
      out[i + j] = handle_of(cand[j]);
    }
    i += found;
    more = found == g;
  }
  match_queried_ += n;
  match_hit_ += i;
  refs_[int(Holder::Host)] += i;
  *out_n = i;
  return KVT_OK;
}

kvt_status Tier::evictable(kvt_block *out, size_t cap, size_t *n) {
  Locked lock(*this);
  std::vector<uint32_t> order = ev_.order(cap);
  for (size_t i = 0; i < order.size(); ++i) out[i] = handle_of(order[i]);
  *n = ev_.evictable();
  return KVT_OK;
}

kvt_status Tier::info(kvt_block_info *out, kvt_block b) {
  Locked lock(*this);
  uint32_t s = 0;
  if (kvt_status st = resolve(b, &s); st != KVT_OK) return st;
  const Slot &sl = slots_[s];
  kvt_block_info r{};
  r.struct_size = sizeof r;
  r.state = State(sl.state) == State::Removed ? uint32_t(KVT_BLOCK_EMPTY) : sl.state;
  r.tier = id_;
  r.refs = sl.refs;
  if (auto it = tokens_.find(s); it != tokens_.end()) r.tokens = it->second->count;
  if (is_registered(State(sl.state))) {
    r.tokens = page_size_;
    r.seq_hash = sl.seq_hash;
    r.parent_hash = sl.parent_hash;
  }
  *out = r;
  return KVT_OK;
}

kvt_status Tier::peek_registered(kvt_block b, uint64_t *hash, uint64_t *parent) {
  Locked lock(*this);
  uint32_t s = 0;
  if (kvt_status st = resolve(b, &s); st != KVT_OK) return st;
  if (!is_registered(State(slots_[s].state)))
    return fail(KVT_ERR_STATE, "block 0x%llx is %s: only registered blocks can be transferred",
                ull(b), state_name(State(slots_[s].state)));
  *hash = slots_[s].seq_hash;
  *parent = slots_[s].parent_hash;
  return KVT_OK;
}

bool Tier::contains(uint64_t hash) {
  Locked lock(*this);
  return registry_.find(hash) != kNil;
}

void Tier::contains_each(const uint64_t *hashes, size_t n, uint8_t *present) {
  Locked lock(*this);
  for (size_t i = 0; i < n; ++i) present[i] = registry_.find(hashes[i]) != kNil;
}

// An Empty block holds only its owner's reference, plus one pin while an onboard writes
// it: a second onboard naming it is refused at enqueue, or drops the pair at commit.
kvt_status Tier::expect_empty(kvt_block b) {
  Locked lock(*this);
  uint32_t s = 0;
  if (kvt_status st = expect(b, &s, State::Empty, "onboard"); st != KVT_OK) return st;
  if (slots_[s].refs != 1)
    return fail(KVT_ERR_STATE, "onboard: block 0x%llx is the destination of another onboard",
                ull(b));
  return KVT_OK;
}

kvt_status Tier::pin_empty(kvt_block b) {
  Locked lock(*this);
  uint32_t s = 0;
  if (kvt_status st = expect(b, &s, State::Empty, "onboard"); st != KVT_OK) return st;
  if (slots_[s].refs != 1)
    return fail(KVT_ERR_STATE, "onboard: block 0x%llx is the destination of another onboard",
                ull(b));
  ++slots_[s].refs;
  ++refs_[int(Holder::Pipeline)];
  return KVT_OK;
}

void Tier::commit_onboarded(kvt_block *out, kvt_block b, uint64_t seq_hash, uint64_t parent,
                            bool pin_existing) {
  Locked lock(*this);
  uint32_t s = handle::slot(b);
  --refs_[int(Holder::Pipeline)];
  *out = 0;
  if (slots_[s].refs == 1) {  // only ours: the caller let go of it during the copy
    free_slot(s);
    return;
  }
  --slots_[s].refs;
  if (uint32_t existing = registry_.find(seq_hash); existing != kNil) {
    if (pin_existing) {
      pin(existing);
      ++refs_[int(Holder::Pipeline)];
      ++dedups_;
      *out = handle_of(existing);
    }
    return;  // the copy is dropped
  }
  commit_registration(out, s, seq_hash, parent);
}

void Tier::hand_over(kvt_block replaced) {
  Locked lock(*this);
  --refs_[int(Holder::Pipeline)];
  ++refs_[int(Holder::Host)];
  uint32_t s = handle::slot(replaced);
  Slot &sl = slots_[s];
  // Unless the caller has released it already.
  if (s < high_water_ && sl.gen == handle::gen(replaced) && State(sl.state) == State::Empty &&
      sl.refs > 0) {
    --sl.refs;
    --refs_[int(Holder::Host)];
    settle_locked(replaced);
  }
}

void Tier::remove(kvt_block b) {
  Locked lock(*this);
  uint32_t s = 0;
  if (resolve(b, &s) != KVT_OK) return;
  Slot &sl = slots_[s];
  if (!is_registered(State(sl.state))) return;
  ev_.dropped(s);
  registry_.erase(sl.seq_hash);
  note_event(KVT_EVENT_BLOCK_REMOVED, sl.seq_hash, 0);
  if (State(sl.state) == State::Inactive) {  // no holder: free it now
    --n_inactive_;
    ++n_active_;
    free_slot(s);
    return;
  }
  sl.state = uint32_t(State::Removed);
}

std::vector<uint64_t> Tier::hashes(std::vector<uint64_t> *parents) {
  std::vector<uint64_t> out;
  std::lock_guard lock(mu_);
  out.reserve(registry_.size());
  if (parents) parents->reserve(registry_.size());
  for (uint32_t s = 0; s < high_water_; ++s) {
    if (!is_registered(State(slots_[s].state))) continue;
    out.push_back(slots_[s].seq_hash);
    if (parents) parents->push_back(slots_[s].parent_hash);
  }
  return out;
}

uint64_t Tier::clear() {
  Locked lock(*this);
  uint64_t removed = 0;
  for (uint32_t s = 0; s < high_water_; ++s) {
    Slot &sl = slots_[s];
    if (!is_registered(State(sl.state))) continue;
    // Publish as the buffer fills: a tier may hold far more blocks than it reserved events.
    if (pending_events_.size() == pending_events_.capacity()) publish_events_locked();
    ev_.dropped(s);  // out of the evictable set, its pin and priority dropped
    registry_.erase(sl.seq_hash);
    note_event(KVT_EVENT_BLOCK_REMOVED, sl.seq_hash, 0);
    ++removed;
    if (State(sl.state) == State::Inactive) {  // no holder: free it now
      --n_inactive_;
      ++n_active_;
      free_slot(s);
    } else {
      sl.state = uint32_t(State::Removed);
    }
  }
  if (pending_events_.size() == pending_events_.capacity()) publish_events_locked();
  note_event(KVT_EVENT_TIER_CLEARED, 0, 0);
  return removed;
}

kvt_status Tier::resolve_bytes_locked(kvt_block b, uint32_t *s) const noexcept {
  if (kvt_status st = resolve(b, s); st != KVT_OK) return st;
  if (slots_[*s].refs == 0)
    return fail(KVT_ERR_STATE, "block 0x%llx holds no reference: match or retain it first",
                ull(b));
  if (!memory_.has_bytes())
    return fail(KVT_ERR_UNSUPPORTED, "G%d blocks are not in memory (G3 lives on disk)",
                int(id_));
  return KVT_OK;
}

kvt_status Tier::data(void **out_ptr, kvt_block b) {
  Locked lock(*this);
  uint32_t s = 0;
  if (kvt_status st = resolve_bytes_locked(b, &s); st != KVT_OK) return st;
  if (!memory_.host_visible())
    return fail(KVT_ERR_UNSUPPORTED, "G%d is in CUDA device memory, not host-visible",
                int(id_));
  void *p = memory_.block(s);
  if (p == nullptr && memory_.chunk(s, 0, 0) != nullptr)
    return fail(KVT_ERR_UNSUPPORTED,
                "the engine's G1 layout scatters a block's chunks: use kvt_block_chunk");
  *out_ptr = p;
  return KVT_OK;
}

kvt_status Tier::chunk(void **out_ptr, kvt_block b, uint32_t layer, uint32_t outer) {
  Locked lock(*this);
  uint32_t s = 0;
  if (kvt_status st = resolve_bytes_locked(b, &s); st != KVT_OK) return st;
  *out_ptr = memory_.chunk(s, layer, outer);
  return KVT_OK;
}

uint64_t Tier::refs_held(Holder h) {
  Locked lock(*this);
  return refs_[int(h)];
}

// ---- token path ----

kvt_status Tier::init(kvt_block b, uint64_t salt_hash, uint64_t parent) {
  Locked lock(*this);
  uint32_t s = 0;
  if (kvt_status st = expect(b, &s, State::Empty, "init"); st != KVT_OK) return st;
  auto buf = std::make_unique<TokenBuf>();
  buf->salt_hash = salt_hash;
  buf->parent = parent;
  buf->tokens = std::make_unique<uint32_t[]>(page_size_);
  tokens_[s] = std::move(buf);
  slots_[s].state = uint32_t(State::Partial);
  return KVT_OK;
}

kvt_status Tier::append(kvt_block b, const uint32_t *tokens, size_t n) {
  Locked lock(*this);
  uint32_t s = 0;
  if (kvt_status st = resolve(b, &s); st != KVT_OK) return st;
  State have = State(slots_[s].state);
  if (have != State::Partial && have != State::Ready)
    return fail(KVT_ERR_STATE,
                "append needs a block in state Partial or ReadyForScheduling; block 0x%llx is %s",
                ull(b), state_name(have));
  TokenBuf &buf = *tokens_.at(s);
  if (n == 0 || n > page_size_ - buf.count)
    return fail(KVT_ERR_INVALID_ARGUMENT,
                "append of %zu tokens: the block holds %u of %u and takes 1 to %u more", n,
                buf.count, page_size_, page_size_ - buf.count);
  std::memcpy(buf.tokens.get() + buf.count, tokens, n * sizeof(uint32_t));
  buf.count += uint32_t(n);
  slots_[s].state = uint32_t(State::Ready);
  return KVT_OK;
}

kvt_status Tier::schedule(kvt_block b) {
  Locked lock(*this);
  uint32_t s = 0;
  if (kvt_status st = expect(b, &s, State::Ready, "schedule"); st != KVT_OK) return st;
  slots_[s].state = uint32_t(State::Inflight);
  return KVT_OK;
}

kvt_status Tier::unschedule(kvt_block b) {
  Locked lock(*this);
  uint32_t s = 0;
  if (kvt_status st = expect(b, &s, State::Ready, "unschedule"); st != KVT_OK) return st;
  slots_[s].state = uint32_t(State::Partial);
  return KVT_OK;
}

kvt_status Tier::compute_done(kvt_block b) {
  Locked lock(*this);
  uint32_t s = 0;
  if (kvt_status st = expect(b, &s, State::Inflight, "compute_done"); st != KVT_OK) return st;
  bool full = tokens_.at(s)->count == page_size_;
  slots_[s].state = uint32_t(full ? State::Complete : State::Partial);
  return KVT_OK;
}

kvt_status Tier::register_tokens(kvt_block *out, kvt_block b) {
  Locked lock(*this);
  uint32_t s = 0;
  if (kvt_status st = expect(b, &s, State::Complete, "register"); st != KVT_OK) return st;
  auto it = tokens_.find(s);
  if (it == tokens_.end())
    return fail(KVT_ERR_STATE,
                "block 0x%llx was filled without tokens: register it with "
                "kvt_block_register_hash",
                ull(b));
  const TokenBuf &buf = *it->second;
  ChainHasher h(buf.salt_hash);
  uint64_t block_hash = h.block(buf.tokens.get(), page_size_);
  uint64_t seq = buf.parent == 0 ? block_hash : h.chain(buf.parent, block_hash);
  return commit_registration(out, s, seq, buf.parent);
}

// ---- introspection ----

void Tier::stats(kvt_tier_stats *out) {
  Locked lock(*this);
  out->memory = memory_.has_bytes() ? memory_.kind() : 0;
  out->capacity = capacity_;
  out->free = n_free_;
  out->active = n_active_;
  out->inactive = n_inactive_;
  out->retired = n_retired_;
  out->registered = registry_.size();
  out->metadata_bytes =
      capacity_ * sizeof(Slot) +
      registry_.bytes() + ev_.bytes() +
      tokens_.size() * (sizeof(TokenBuf) + page_size_ * sizeof(uint32_t));
  out->allocs = allocs_;
  out->evictions = evictions_;
  out->registrations = registrations_;
  out->dedups = dedups_;
  out->match_queried = match_queried_;
  out->match_hit = match_hit_;
  out->pinned = ev_.pinned();
  out->recovered = recovered_;
}

kvt_status Tier::check() {
  Locked lock(*this);
  auto bad = [&](const char *what, uint64_t a, uint64_t b) {
    return fail(KVT_ERR_INTERNAL, "G%d invariant violated: %s (%llu vs %llu)", int(id_), what,
                ull(a), ull(b));
  };
  if (n_free_ + n_active_ + n_inactive_ + n_retired_ != capacity_)
    return bad("free + active + inactive + retired != capacity",
               n_free_ + n_active_ + n_inactive_ + n_retired_, capacity_);
  uint64_t free = capacity_ - high_water_, active = 0, inactive = 0, retired = 0, registered = 0;
  uint64_t refs = 0;
  for (uint32_t s = 0; s < high_water_; ++s) {
    const Slot &sl = slots_[s];
    State st = State(sl.state);
    if (st == State::Free) {
      ++free;
      if (sl.refs != 0) return bad("free slot with references", s, sl.refs);
      continue;
    }
    if (st == State::Retired) {
      ++retired;
      if (sl.refs != 0) return bad("retired slot with references", s, sl.refs);
      if (sl.gen != handle::kLastGen) return bad("retired slot before its last generation", s,
                                                 sl.gen);
      continue;
    }
    if (st == State::Inactive) {
      ++inactive;
      if (sl.refs != 0) return bad("inactive slot with references", s, sl.refs);
      if (sl.gen == handle::kLastGen) return bad("inactive slot at its last generation", s, 0);
    } else {
      ++active;
      refs += sl.refs;
      if (sl.refs == 0) return bad("active slot without references", s, 0);
      if (is_mutable(st) && sl.refs > 2) return bad("mutable slot shared", s, sl.refs);
    }
    if (is_registered(st)) {
      ++registered;
      if (registry_.find(sl.seq_hash) != s)
        return bad("registered slot missing from the registry", s, sl.seq_hash);
    }
    if (st == State::Partial || st == State::Ready || st == State::Inflight) {
      if (!tokens_.contains(s)) return bad("token-path slot without tokens", s, 0);
    }
  }
  if (free != n_free_) return bad("free count", free, n_free_);
  if (active != n_active_) return bad("active count", active, n_active_);
  if (inactive != n_inactive_) return bad("inactive count", inactive, n_inactive_);
  if (retired != n_retired_) return bad("retired count", retired, n_retired_);
  if (registered != registry_.size()) return bad("registry size", registered, registry_.size());
  if (refs != refs_[0] + refs_[1])
    return bad("references on slots vs held by the host and the pipeline", refs,
               refs_[0] + refs_[1]);
  if (kvt_status st = ev_.check(high_water_, n_inactive_); st != KVT_OK) return st;
  uint64_t walked = 0;
  for (uint32_t s = free_head_; s != kNil; s = slots_[s].next) {
    if (State(slots_[s].state) != State::Free) return bad("free list links a used slot", s, 0);
    if (++walked > n_free_) return bad("free list longer than its count", walked, n_free_);
  }
  if (walked + (capacity_ - high_water_) != n_free_)
    return bad("free list length", walked + (capacity_ - high_water_), n_free_);
  return KVT_OK;
}

}  // namespace kvt
