#include "pipeline/executor.hpp"

#include <algorithm>
#include <cstdio>
#include <memory>
#include <utility>

#include "block/handle.hpp"
#include "common/error.hpp"
#include "memory/mapping.hpp"
#include "remote/store.hpp"
#include "copy/copy_set.hpp"
#include "copy/cuda_engine.hpp"
#include "copy/disk_engine.hpp"
#include "copy/memcpy_engine.hpp"

namespace kvt {

// One committed piece. items[k] indexes t->src (and t->dst): the blocks whose weak
// references upgraded; dst[k] is where item k goes.
struct Executor::Entry {
  const Piece *piece;
  Result *result;
  std::vector<size_t> items;
  std::vector<kvt_block> dst;
  std::vector<int> op;                 // item k's disk operation in the batch, or -1
  std::vector<AlignedBuffer> staging;  // onboard from G3: verified here before G1 sees it
  // G4: item k's contiguous bytes (a block of a host tier, or staging), and whether they
  // are staged, so that a read goes on into the block.
  std::vector<void *> g4_data;
  std::vector<bool> g4_staged;
  Transfer &t() const { return *piece->t; }
  bool from_g4() const { return t().src_tier == KVT_TIER_G4; }
  void fail(kvt_status st, std::string why) {
    if (from_g4()) return fail_at(items.empty() ? 0 : items.front(), st, std::move(why));
    if (result->status != KVT_OK) return;  // the first failure names the piece's
    result->status = st;
    result->message = std::move(why);
  }
  // From G4, the failure of the first item in chain order is the piece's.
  void fail_at(size_t item, kvt_status st, std::string why) {
    if (result->status != KVT_OK && item >= result->fail_item) return;
    result->status = st;
    result->message = std::move(why);
    result->fail_item = item;
  }
};

// Every copy of a batch, by phase, each with the piece it serves.
struct Executor::Plan {
  std::vector<BlockCopy> before_disk, after_disk;  // memory copies, before and after the disk
  std::vector<Entry *> before_owner, after_owner;
  std::vector<DiskOp> ops;                         // G3's reads and writes
  std::vector<Entry *> op_owner;
};

namespace {
// Shares a phase's duration among the directions of the blocks it moved.
template <class E>
void charge(double busy_ns[kDirections], Clock::duration t, const std::vector<E *> &owners) {
  if (owners.empty()) return;
  double per = double(std::chrono::nanoseconds(t).count()) / double(owners.size());
  for (E *e : owners) busy_ns[index(*e->t().dir)] += per;
}
}  // namespace

// Runs one phase of copies, whole blocks (copy_set.hpp). A failed CUDA copy fails the pieces
// it served.
void Executor::run_copies(const std::vector<BlockCopy> &copies,
                          const std::vector<Entry *> &owner) {
  CopySet set(tiers_.geometry());
  for (size_t i = 0; i < copies.size(); ++i) set.add(copies[i], i);
  for (CopySet::Failure &f : set.run(cuda_, pool_))
    owner[f.owner]->fail(f.status, std::move(f.message));
}

namespace {
unsigned long long ull(uint64_t v) { return v; }

std::string g4_message(kvt_status st, uint64_t hash) {
  char buf[160];
  std::snprintf(buf, sizeof buf,
                st == KVT_ERR_NOT_FOUND ? "G4 holds no value for hash 0x%llx (never stored, "
                                          "or evicted by Redis)"
                : st == KVT_ERR_CORRUPT ? "G4's value for hash 0x%llx failed its header or "
                                          "checksum; the key was deleted"
                                        : "G4 could not be reached for hash 0x%llx",
                ull(hash));
  std::string m = buf;
  if (st == KVT_ERR_IO) m += std::string(": ") + last_error();
  return m;
}
}  // namespace

void Executor::run_g4(std::vector<Entry> &entries, std::vector<BlockCopy> &after,
                      std::vector<Entry *> &after_owner, double busy_ns[kDirections]) {
  const uint64_t bytes = tiers_.geometry().block_bytes();
  std::vector<remote::Put> puts;
  std::vector<remote::Get> gets;
  std::vector<std::pair<Entry *, size_t>> put_of, get_of;  // (entry, k) of each
  for (Entry &e : entries) {
    if (e.g4_data.empty() || e.result->status != KVT_OK) continue;
    Transfer &t = e.t();
    for (size_t k = 0; k < e.items.size(); ++k) {
      const SourceRef &r = t.src[e.items[k]];
      if (t.dst_tier == KVT_TIER_G4) {
        puts.push_back({r.hash, r.parent, e.g4_data[k], bytes});
        put_of.push_back({&e, k});
      } else {
        gets.push_back({r.hash, r.parent, e.g4_data[k], bytes});
        get_of.push_back({&e, k});
      }
    }
  }
  if (puts.empty() && gets.empty()) return;
  Clock::time_point t0 = Clock::now();
  std::vector<kvt_status> put_status(puts.size(), KVT_OK);
  if (!puts.empty()) g4_->put(puts.data(), puts.size(), put_status.data());
  if (!gets.empty()) g4_->get(gets.data(), gets.size());
  // Each direction's share of the round trips, by blocks.
  std::vector<Entry *> owners;
  for (auto &[e, k] : put_of) owners.push_back(e);
  for (auto &[e, k] : get_of) owners.push_back(e);
  charge(busy_ns, Clock::now() - t0, owners);

  for (size_t i = 0; i < puts.size(); ++i) {
    auto [e, k] = put_of[i];
    if (put_status[i] == KVT_OK) ++e->result->count;
    else e->fail(put_status[i], g4_message(put_status[i], puts[i].hash));
  }
  for (size_t i = 0; i < gets.size(); ++i) {
    auto [e, k] = get_of[i];
    if (gets[i].status != KVT_OK) {
      e->fail_at(e->items[k], gets[i].status, g4_message(gets[i].status, gets[i].hash));
    } else if (e->g4_staged[k]) {  // verified by the store: now the block may have it
      after.push_back({{tiers_.memory(e->t().dst_tier), handle::slot(e->dst[k]), nullptr},
                       {nullptr, 0, e->g4_data[k]}});
      after_owner.push_back(e);
    }
  }
}

// Commit and reserve: weak references become strong (what was evicted or released is
// dropped), under the transfer's lock, so that a cancel comes before or not at all, and an
// INFLIGHT transfer's committed destinations are pinned. G4's keys take no reference.
void Executor::commit(Entry &e) {
  const Piece &p = *e.piece;
  Transfer &t = e.t();
  std::lock_guard lock(t.mu);
  if (t.ended()) return;  // cancelled while batched
  e.result->committed = true;
  const size_t n = p.end - p.begin;
  const bool keys = t.src_tier == KVT_TIER_G4;
  std::vector<kvt_block> src(n);
  std::unique_ptr<bool[]> ok(new bool[n]), pinned(new bool[n]);
  for (size_t k = 0; k < n; ++k) src[k] = t.src[p.begin + k].handle;
  if (keys) std::fill(ok.get(), ok.get() + n, true);
  else if (n > 0) tiers_.retain(t.src_tier, src.data(), n, ok.get());
  if (t.onboard && n > 0) {
    tiers_.pin_empty(t.dst.data() + p.begin, n, pinned.get());
    for (size_t k = 0; k < n; ++k) {
      if (ok[k] && !pinned[k] && !keys) tiers_.release(&src[k], 1);
      if (ok[k] && pinned[k]) continue;
      if (!ok[k] && pinned[k]) tiers_.release(&t.dst[p.begin + k], 1);
      ok[k] = false;
    }
  }
  for (size_t k = 0; k < n; ++k)
    if (ok[k]) e.items.push_back(p.begin + k);
  t.state = KVT_XFER_INFLIGHT;
}

// Where each committed item's bytes go, and through which phase: a memory copy before the
// disk, a G3 operation, a G4 put or get (staged where the block is not contiguous host
// memory), or a read from G3 that is scattered into G1 once verified.
void Executor::plan(Entry &e, Plan &p) {
  const Geometry &g = tiers_.geometry();
  Transfer &t = e.t();
  const size_t n = e.items.size();
  e.op.assign(n, -1);
  if (n == 0) return;
  const bool to_g4 = t.dst_tier == KVT_TIER_G4;
  if (t.onboard) {
    for (size_t i : e.items) e.dst.push_back(t.dst[i]);
  } else if (!to_g4) {
    e.dst.resize(n);
    if (tiers_.alloc(t.dst_tier, e.dst.data(), n) != KVT_OK) {
      e.dst.clear();
      e.fail(KVT_ERR_NO_SPACE, last_error());
      return;
    }
  }
  const TierMemory *sm = tiers_.memory(t.src_tier);
  const TierMemory *dm = tiers_.memory(t.dst_tier);
  if (e.from_g4() || to_g4) {
    e.g4_data.assign(n, nullptr);
    e.g4_staged.assign(n, false);
  }
  auto stage = [&] {
    e.staging.push_back(aligned_buffer(g.block_bytes()));
    return e.staging.back().get();
  };
  auto disk_op = [&](size_t k, bool write, uint32_t slot, void *data, const SourceRef &r) {
    e.op[k] = int(p.ops.size());
    p.ops.push_back({write, slot, data, r.hash, r.parent});
    p.op_owner.push_back(&e);
  };
  auto copy_first = [&](BlockRef to, BlockRef from) {
    p.before_disk.push_back({to, from});
    p.before_owner.push_back(&e);
  };
  for (size_t k = 0; k < n; ++k) {
    const SourceRef &r = t.src[e.items[k]];
    if (e.from_g4()) {  // read into the block where it is contiguous host memory
      const uint32_t slot = handle::slot(e.dst[k]);
      void *data = dm->host_visible() ? dm->block(slot) : nullptr;
      if (data == nullptr) {
        data = stage();
        e.g4_staged[k] = true;
      }
      e.g4_data[k] = data;
      continue;
    }
    BlockRef from{sm, handle::slot(r.handle), nullptr};
    if (to_g4) {  // the source's bytes, contiguous: in place, staged, or read from G3
      void *data = sm && sm->host_visible() ? sm->block(from.slot) : nullptr;
      if (data == nullptr) {
        data = stage();
        if (sm) copy_first({nullptr, 0, data}, from);
        else disk_op(k, false, from.slot, data, r);
      }
      e.g4_data[k] = data;
      continue;
    }
    BlockRef to{dm, handle::slot(e.dst[k]), nullptr};
    if (sm && dm) {  // memory to memory
      copy_first(to, from);
    } else if (dm == nullptr) {  // to G3: write the source block, staged if scattered or on a GPU
      void *data = sm->host_visible() ? sm->block(from.slot) : nullptr;
      if (data == nullptr) {
        data = stage();
        copy_first({nullptr, 0, data}, from);
      }
      disk_op(k, true, to.slot, data, r);
    } else {  // from G3 to G1: read into staging, check, then scatter into the block
      disk_op(k, false, from.slot, stage(), r);
    }
  }
}

// The disk's outcome for e: a failed operation fails the piece, and a piece read from G3
// intact goes on into G1 (only now may G1 see the bytes).
void Executor::check_disk(Entry &e, Plan &p) {
  for (size_t k = 0; k < e.op.size(); ++k) {
    if (e.op[k] < 0) continue;
    const DiskOp &op = p.ops[e.op[k]];
    if (op.status == KVT_OK) continue;
    e.fail(op.status, disk_->describe(op));
    // A stored copy that failed its checksum is gone for good: it leaves the registry, so
    // that the next match misses it and the block is recomputed once.
    if (op.status == KVT_ERR_CORRUPT && !op.write) tiers_.remove(e.t().src[e.items[k]].handle);
  }
  if (e.result->status != KVT_OK || !e.t().onboard || e.from_g4() || e.staging.empty()) return;
  for (size_t k = 0; k < e.items.size(); ++k) {
    p.after_disk.push_back({{tiers_.memory(KVT_TIER_G1), handle::slot(e.dst[k]), nullptr},
                            {nullptr, 0, e.staging[k].get()}});
    p.after_owner.push_back(&e);
  }
}

// Commits what an offload stored (an onboard's blocks wait for the transfer's end) and gives
// back the references.
void Executor::finish(Entry &e) {
  Transfer &t = e.t();
  const size_t n = e.items.size();
  if (t.onboard) {
    // From G4, the items before the first failure landed; the rest are given back.
    std::vector<kvt_block> back;
    for (size_t k = 0; k < n; ++k) {
      if (e.result->status == KVT_OK || (e.from_g4() && e.items[k] < e.result->fail_item))
        e.result->landed.push_back({e.items[k], e.dst[k]});
      else
        back.push_back(e.dst[k]);
    }
    tiers_.release(back.data(), back.size());  // the pins; the blocks stay the caller's
  } else if (!e.dst.empty()) {
    if (e.result->status == KVT_OK) {
      std::vector<uint64_t> hash(n), parent(n);
      for (size_t k = 0; k < n; ++k) {
        hash[k] = t.src[e.items[k]].hash;
        parent[k] = t.src[e.items[k]].parent;
      }
      tiers_.store(t.dst_tier, e.dst.data(), hash.data(), parent.data(), n);
      e.result->count = n;
    }
    tiers_.release(e.dst.data(), n);  // the copies stay in dst, unreferenced and matchable
  }
  if (e.from_g4()) return;
  std::vector<kvt_block> held;  // the strong references on the sources
  held.reserve(n);
  for (size_t i : e.items) held.push_back(t.src[i].handle);
  tiers_.release(held.data(), held.size());
}

std::vector<Executor::Result> Executor::run(const std::vector<Piece> &batch,
                                            double busy_ns[kDirections]) {
  std::vector<Result> results(batch.size());
  std::vector<Entry> entries(batch.size());
  Plan p;
  for (size_t i = 0; i < batch.size(); ++i) {
    entries[i].piece = &batch[i];
    entries[i].result = &results[i];
    commit(entries[i]);
  }
  for (Entry &e : entries) plan(e, p);

  Clock::time_point t0 = Clock::now();
  run_copies(p.before_disk, p.before_owner);
  Clock::time_point t1 = Clock::now();
  if (!p.ops.empty()) disk_->run(p.ops);
  Clock::time_point t2 = Clock::now();
  charge(busy_ns, t1 - t0, p.before_owner);
  charge(busy_ns, t2 - t1, p.op_owner);
  for (Entry &e : entries) check_disk(e, p);
  run_g4(entries, p.after_disk, p.after_owner, busy_ns);
  t2 = Clock::now();
  run_copies(p.after_disk, p.after_owner);
  charge(busy_ns, Clock::now() - t2, p.after_owner);

  for (Entry &e : entries) finish(e);
  return results;
}

}  // namespace kvt
