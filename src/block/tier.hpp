// One tier's block pool: slots and their states, the registry from sequence hash to slot,
// the free list and the evictable set (eviction.hpp). Every public method takes the tier's
// lock unless its name ends in _locked, in which case the caller holds lock().
#pragma once

#include <absl/container/flat_hash_map.h>

#include <vector>
#include <cstdint>
#include <memory>
#include <mutex>

#include "block/eviction.hpp"
#include "block/handle.hpp"
#include "block/registry.hpp"
#include "block/slot.hpp"
#include "event/event_queue.hpp"
#include "event/kv_sink.hpp"
#include "event/obs_sink.hpp"
#include "hash/chain_hash.hpp"
#include "kvtier.h"
#include "memory/tier_memory.hpp"

namespace kvt {

// Who holds a reference: the host (through handles it was given) or the pipeline (while it
// copies). Each tier counts both, and check() holds the slots' references to those counts.
enum class Holder : uint8_t { Host, Pipeline };

class Tier {
 public:
  // first_gen: the generation of slots never used before; tests start it near the last.
  Tier(kvt_tier id, uint32_t tag, uint64_t capacity, uint32_t page_size,
       uint32_t first_gen = 0, EvictionConfig eviction = {});
  ~Tier();
  Tier(const Tier &) = delete;
  Tier &operator=(const Tier &) = delete;

  kvt_tier id() const noexcept { return id_; }
  TierMemory &memory() noexcept { return memory_; }
  void set_events(EventQueue *ev) noexcept { events_ = ev; }
  // The KV-event publisher, if any: it also sees this tier's events, and the tokens of the
  // blocks registered from tokens.
  void set_kv_sink(KvSink *sink) noexcept { sink_ = sink; }
  void set_obs(ObsSink *obs) noexcept { obs_ = obs; }

  kvt_status alloc(kvt_block *out, size_t n, Holder h = Holder::Host);
  kvt_status retain(kvt_block b, Holder h = Holder::Host);
  kvt_status register_hash(kvt_block *out, kvt_block b, uint64_t seq_hash, uint64_t parent);
  // Registers a chain: blocks[i] under seq_hashes[i], its parent seq_hashes[i - 1] (parent
  // for the first). All blocks must be in this tier; all or nothing.
  kvt_status register_chain(kvt_block *out, const kvt_block *blocks, const uint64_t *seq_hashes,
                            size_t n, uint64_t parent);
  kvt_status match(size_t *out_n, kvt_block *out, const uint64_t *hashes, size_t n);
  // The first cap inactive blocks in eviction order into out, and how many are evictable
  // into *n, without changing anything.
  kvt_status evictable(kvt_block *out, size_t cap, size_t *n);
  kvt_status info(kvt_block_info *out, kvt_block b);
  // For the pipeline: the hashes of a registered block (active or inactive); whether a hash
  // is registered; whether a block is a fresh Empty one.
  kvt_status peek_registered(kvt_block b, uint64_t *hash, uint64_t *parent);
  bool contains(uint64_t hash);
  // present[i]: whether hashes[i] is registered; one lock for all of them.
  void contains_each(const uint64_t *hashes, size_t n, uint8_t *present);
  kvt_status expect_empty(kvt_block b);
  // Onboard: the pipeline's own reference on the caller's Empty destination while it is
  // written, then the registration that drops it; *out is b. If the caller released the
  // block in the meantime it is freed instead and *out is 0. Where the hash is registered
  // already, the caller's block stays Empty and the caller's, and *out is the registered
  // block with one more reference, held by the pipeline (with pin_existing), or 0.
  kvt_status pin_empty(kvt_block b);
  void commit_onboarded(kvt_block *out, kvt_block b, uint64_t seq_hash, uint64_t parent,
                        bool pin_existing);
  // The host takes over one reference that commit_onboarded pinned for it, in place of its
  // own on the Empty block `replaced`, which is released (freed, its handle going stale).
  void hand_over(kvt_block replaced);
  // G3 warm restart: registers the blocks that a persistent file holds, each at its slot,
  // as inactive registered blocks evicted in the order given. Only on a tier that has handed
  // out nothing yet. A slot out of range or given twice, and a hash given twice, are skipped.
  // Emits no event: the host learns of them from kvt_tier_stats.recovered and match, and
  // the KV-event publisher from the manager's announcement at start; *registered (when
  // given) gets the blocks registered, in the order given.
  struct Recovered {
    uint32_t slot;
    uint64_t seq_hash, parent;
  };
  uint64_t recover(const Recovered *blocks, size_t n,
                   std::vector<Recovered> *registered = nullptr);
  // A registered block whose stored copy proved corrupt leaves the registry (BLOCK_REMOVED);
  // its holders keep their references, and its last release frees it.
  void remove(kvt_block b);
  // kvt_manager_reset: every registered block leaves the registry as remove() takes one
  // (BLOCK_REMOVED each): inactive ones are freed, held ones freed at their last release.
  // Then TIER_CLEARED. Mutable blocks stay as they are. Returns how many left.
  uint64_t clear();
  // The hashes registered now (kvt_tier_hashes), in slot order; *parents (when given) gets
  // each one's parent hash, 0 for a first block.
  std::vector<uint64_t> hashes(std::vector<uint64_t> *parents = nullptr);
  // Host-visible address checks for kvt_block_data / kvt_block_chunk.
  kvt_status data(void **out_ptr, kvt_block b);
  kvt_status chunk(void **out_ptr, kvt_block b, uint32_t layer, uint32_t outer);

  // Token path.
  kvt_status init(kvt_block b, uint64_t salt_hash, uint64_t parent);
  kvt_status append(kvt_block b, const uint32_t *tokens, size_t n);
  kvt_status schedule(kvt_block b);
  kvt_status unschedule(kvt_block b);
  kvt_status compute_done(kvt_block b);
  kvt_status register_tokens(kvt_block *out, kvt_block b);

  // Release is done by the manager across tiers, in two phases under every involved lock:
  // take one reference per handle (undoable), then settle the blocks left without any.
  std::mutex &lock() noexcept { return mu_; }
  kvt_status take_ref_locked(kvt_block b, Holder h = Holder::Host);
  void undo_take_ref_locked(kvt_block b, Holder h = Holder::Host);
  void settle_locked(kvt_block b);

  // kvt_block_pin / unpin / set_priority, all or nothing over blocks of several tiers: the
  // caller holds lock() of each tier involved, resolves every block with
  // registered_locked, then drives evictor_locked() as Evictor describes.
  kvt_status registered_locked(kvt_block b, const char *fn, size_t i, uint32_t *s) const noexcept;
  Evictor &evictor_locked() noexcept { return ev_; }

  void stats(kvt_tier_stats *out);
  kvt_status check();
  uint64_t refs_held(Holder h);

 private:
  static constexpr uint32_t kNil = UINT32_MAX;
  struct TokenBuf;  // token-path state of one mutable block
  // Holds the lock; on leaving, publishes the events the operation produced, then unlocks,
  // so that events appear in the order of the changes they describe.
  class Locked {
   public:
    explicit Locked(Tier &t) : t_(t), lock_(t.mu_) {}
    ~Locked() { t_.publish_events_locked(); }

   private:
    Tier &t_;
    std::unique_lock<std::mutex> lock_;
  };

  kvt_block handle_of(uint32_t slot) const noexcept;
  // Validates a handle; on success *out is its slot index.
  kvt_status resolve(kvt_block b, uint32_t *out) const noexcept;
  kvt_status expect(kvt_block b, uint32_t *out, State want, const char *op) const noexcept;
  // A referenced block of a tier that holds bytes (not G3): for data and chunk access.
  kvt_status resolve_bytes_locked(kvt_block b, uint32_t *s) const noexcept;
  uint32_t take_free_slot() noexcept;
  uint32_t evict_one() noexcept;
  void make_inactive(uint32_t s) noexcept;    // a registered block without references
  void free_slot(uint32_t s) noexcept;        // mutable block back to the free list
  void retire(uint32_t s) noexcept;           // a slot at its last generation leaves for good
  void pin(uint32_t s) noexcept;               // one more reference on a registered block
  void note_event(kvt_event_type type, uint64_t hash, uint64_t parent) noexcept;
  void publish_events_locked() noexcept;
  kvt_status commit_registration(kvt_block *out, uint32_t s, uint64_t seq, uint64_t parent);

  const kvt_tier id_;
  const uint32_t tag_;
  const uint64_t capacity_;
  const uint32_t page_size_;
  const uint32_t first_gen_;
  EventQueue *events_ = nullptr;
  KvSink *sink_ = nullptr;
  ObsSink *obs_ = nullptr;
  TierMemory memory_;

  std::mutex mu_;
  Slot *slots_;  // zeroed mmap, huge pages where the kernel gives them
  Registry<Slot> registry_{&slots_};
  Evictor ev_;
  std::vector<kvt_event> pending_events_;  // produced under the lock, published on leaving
  absl::flat_hash_map<uint32_t, std::unique_ptr<TokenBuf>> tokens_;
  uint32_t high_water_ = 0;  // slots at or above it have never been used
  uint32_t free_head_ = kNil;
  uint64_t refs_[2] = {};  // references held, by Holder
  uint64_t n_free_, n_active_ = 0, n_inactive_ = 0, n_retired_ = 0;
  uint64_t allocs_ = 0, evictions_ = 0, registrations_ = 0, dedups_ = 0;
  uint64_t match_queried_ = 0, match_hit_ = 0;
  uint64_t recovered_ = 0;
};

}  // namespace kvt
