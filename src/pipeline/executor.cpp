#include "pipeline/executor.hpp"

#include <algorithm>
#include <memory>

#include "block/handle.hpp"
#include "common/error.hpp"
#include "memory/mapping.hpp"
#include "transfer/cuda_engine.hpp"
#include "transfer/disk_engine.hpp"
#include "transfer/memcpy_engine.hpp"

namespace kvt {

// One committed piece. items[k] indexes t->src (and t->dst_g1): the blocks whose weak
// references upgraded; dst[k] is where item k goes.
struct Executor::Entry {
  const Piece *piece;
  Result *result;
  std::vector<size_t> items;
  std::vector<kvt_block> dst;
  std::vector<int> op;                 // item k's disk operation in the batch, or -1
  std::vector<AlignedBuffer> staging;  // onboard from G3: verified here before G1 sees it
  Transfer &t() const { return *piece->t; }
  void fail(kvt_status st, std::string why) {
    if (result->status != KVT_OK) return;  // the first failure names the piece's
    result->status = st;
    result->message = std::move(why);
  }
};

namespace {
bool on_device(const BlockRef &r) { return r.mem != nullptr && !r.mem->host_visible(); }

// Shares a phase's duration among the directions of the blocks it moved.
template <class E>
void charge(double busy_ns[kDirections], Clock::duration t, const std::vector<E *> &owners) {
  if (owners.empty()) return;
  double per = double(std::chrono::nanoseconds(t).count()) / double(owners.size());
  for (E *e : owners) busy_ns[index(*e->t().dir)] += per;
}
}  // namespace

// Runs one phase of copies: host-to-host through the memcpy engine, anything touching CUDA
// memory through the CUDA engine. A failed CUDA copy fails the pieces it served.
void Executor::run_copies(const std::vector<BlockCopy> &copies,
                          const std::vector<Entry *> &owner) {
  const Geometry &g = tiers_.geometry();
  std::vector<BlockCopy> host;
  std::vector<Segment> h2d, d2h;
  std::vector<Entry *> h2d_owner, d2h_owner;
  for (size_t i = 0; i < copies.size(); ++i) {
    const BlockCopy &c = copies[i];
    if (on_device(c.dst)) {
      append_segments(g, c, h2d);
      h2d_owner.push_back(owner[i]);
    } else if (on_device(c.src)) {
      append_segments(g, c, d2h);
      d2h_owner.push_back(owner[i]);
    } else {
      host.push_back(c);
    }
  }
  copy_blocks(g, host, pool_);
  for (auto [segs, owners, to_device] : {std::tuple{&h2d, &h2d_owner, true},
                                         std::tuple{&d2h, &d2h_owner, false}}) {
    if (segs->empty()) continue;
    kvt_status st = cuda_ ? cuda_->copy(*segs, to_device)
                          : fail(KVT_ERR_UNSUPPORTED, "no CUDA copy engine for CUDA memory");
    if (st != KVT_OK)
      for (Entry *e : *owners) e->fail(st, last_error());
  }
}

std::vector<Executor::Result> Executor::run(const std::vector<Piece> &batch,
                                            double busy_ns[kDirections]) {
  const Geometry &g = tiers_.geometry();
  std::vector<Result> results(batch.size());
  std::vector<Entry> entries(batch.size());

  // Commit and reserve: weak references become strong (what was evicted or released is
  // dropped), under the transfer's lock, so that a cancel comes before or not at all, and
  // an INFLIGHT transfer's committed destinations are pinned.
  for (size_t i = 0; i < batch.size(); ++i) {
    Entry &e = entries[i];
    e.piece = &batch[i];
    e.result = &results[i];
    Transfer &t = e.t();
    std::lock_guard lock(t.mu);
    if (t.ended()) continue;  // cancelled while batched
    results[i].committed = true;
    const size_t n = batch[i].end - batch[i].begin;
    std::vector<kvt_block> src(n);
    std::unique_ptr<bool[]> ok(new bool[n]), pinned(new bool[n]);
    for (size_t k = 0; k < n; ++k) src[k] = t.src[batch[i].begin + k].handle;
    if (n > 0) tiers_.retain(t.src_tier, src.data(), n, ok.get());
    if (t.onboard && n > 0) {
      tiers_.pin_empty(t.dst_g1.data() + batch[i].begin, n, pinned.get());
      for (size_t k = 0; k < n; ++k) {
        if (ok[k] && !pinned[k]) tiers_.release(&src[k], 1);
        if (ok[k] && pinned[k]) continue;
        if (!ok[k] && pinned[k]) tiers_.release(&t.dst_g1[batch[i].begin + k], 1);
        ok[k] = false;
      }
    }
    for (size_t k = 0; k < n; ++k)
      if (ok[k]) e.items.push_back(batch[i].begin + k);
    t.state = KVT_XFER_INFLIGHT;
  }

  // Plan every copy of the batch.
  std::vector<BlockCopy> before_disk, after_disk;
  std::vector<Entry *> before_owner, after_owner;
  std::vector<DiskOp> ops;
  std::vector<Entry *> op_owner;
  for (Entry &e : entries) {
    Transfer &t = e.t();
    const size_t n = e.items.size();
    e.op.assign(n, -1);
    if (n == 0) continue;
    if (!t.onboard) {
      e.dst.resize(n);
      if (tiers_.alloc(t.dst_tier, e.dst.data(), n) != KVT_OK) {
        e.dst.clear();
        e.fail(KVT_ERR_NO_SPACE, last_error());
        continue;
      }
    } else {
      for (size_t i : e.items) e.dst.push_back(t.dst_g1[i]);
    }
    const TierMemory *sm = tiers_.memory(t.src_tier);
    const TierMemory *dm = tiers_.memory(t.dst_tier);
    for (size_t k = 0; k < n; ++k) {
      const SourceRef &r = t.src[e.items[k]];
      BlockRef from{sm, handle::slot(r.handle), nullptr};
      BlockRef to{dm, handle::slot(e.dst[k]), nullptr};
      if (sm && dm) {  // memory to memory
        before_disk.push_back({to, from});
        before_owner.push_back(&e);
      } else if (dm == nullptr) {  // to G3: write the source block, staged if scattered or on a GPU
        void *data = sm->host_visible() ? sm->block(from.slot) : nullptr;
        if (data == nullptr) {
          e.staging.push_back(aligned_buffer(g.block_bytes()));
          data = e.staging.back().get();
          before_disk.push_back({{nullptr, 0, data}, from});
          before_owner.push_back(&e);
        }
        e.op[k] = int(ops.size());
        ops.push_back({true, to.slot, data, r.hash, r.parent});
        op_owner.push_back(&e);
      } else {  // from G3 to G1: read into staging, check, then scatter into the block
        e.staging.push_back(aligned_buffer(g.block_bytes()));
        e.op[k] = int(ops.size());
        ops.push_back({false, from.slot, e.staging.back().get(), r.hash, r.parent});
        op_owner.push_back(&e);
      }
    }
  }

  Clock::time_point t0 = Clock::now();
  run_copies(before_disk, before_owner);
  Clock::time_point t1 = Clock::now();
  if (!ops.empty()) disk_->run(ops);
  Clock::time_point t2 = Clock::now();
  charge(busy_ns, t1 - t0, before_owner);
  charge(busy_ns, t2 - t1, op_owner);
  for (Entry &e : entries) {
    for (size_t k = 0; k < e.op.size(); ++k) {
      if (e.op[k] < 0) continue;
      const DiskOp &op = ops[e.op[k]];
      if (op.status == KVT_OK) continue;
      e.fail(op.status, disk_->describe(op));
      // A stored copy that failed its checksum is gone for good: it leaves the registry,
      // so that the next match misses it and the block is recomputed once.
      if (op.status == KVT_ERR_CORRUPT && !op.write) tiers_.remove(e.t().src[e.items[k]].handle);
    }
    if (e.result->status != KVT_OK || !e.t().onboard || e.staging.empty()) continue;
    // Every block of this piece read back intact: only now may G1 see the bytes.
    for (size_t k = 0; k < e.items.size(); ++k) {
      after_disk.push_back({{tiers_.memory(KVT_TIER_G1), handle::slot(e.dst[k]), nullptr},
                            {nullptr, 0, e.staging[k].get()}});
      after_owner.push_back(&e);
    }
  }
  t2 = Clock::now();
  run_copies(after_disk, after_owner);
  charge(busy_ns, Clock::now() - t2, after_owner);

  // Commit what an offload stored; an onboard's blocks wait for the transfer's end.
  for (Entry &e : entries) {
    Transfer &t = e.t();
    const size_t n = e.items.size();
    if (t.onboard) {
      if (e.result->status == KVT_OK) {
        for (size_t k = 0; k < n; ++k) e.result->landed.push_back({e.items[k], e.dst[k]});
      } else if (n > 0) {
        tiers_.release(e.dst.data(), n);  // the pins; the blocks stay the caller's
      }
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
    std::vector<kvt_block> held;  // the strong references on the sources
    held.reserve(n);
    for (size_t i : e.items) held.push_back(t.src[i].handle);
    tiers_.release(held.data(), held.size());
  }
  return results;
}

}  // namespace kvt
