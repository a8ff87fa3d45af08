// The Batcher and TransferExecutor stages: when to form a batch, the commitment (P3, P4),
// the flattened copy plan of the whole batch (P5), and the end of each container.
#include <algorithm>

#include "common/error.hpp"
#include "manager/manager.hpp"
#include "memory/mapping.hpp"
#include "pipeline/pipeline.hpp"
#include "transfer/cuda_engine.hpp"
#include "transfer/disk_engine.hpp"
#include "transfer/memcpy_engine.hpp"

namespace kvt {

// One committed container. items[k] indexes x->src (and x->dst_g1): the blocks whose weak
// references upgraded; dst[k] is where item k goes.
struct Pipeline::Entry {
  kvt_xfer *x;
  std::vector<size_t> items;
  std::vector<kvt_block> dst;
  std::vector<int> op;                 // item k's disk operation in the batch, or -1
  std::vector<AlignedBuffer> staging;  // onboard from G3: verified here before G1 sees it
  kvt_status status = KVT_OK;
  std::string message;
  uint64_t count = 0;
  std::vector<kvt_block> final_blocks;
};

struct Pipeline::Batch {
  std::vector<Entry> entries;
  double busy_ns[5] = {};
};

void Pipeline::charge(Batch &b, Clock::duration t, const std::vector<Entry *> &owners) {
  if (owners.empty()) return;
  double per = double(std::chrono::nanoseconds(t).count()) / double(owners.size());
  for (Entry *e : owners)
    if (int d = direction(e->x->src_tier, e->x->dst_tier); d >= 0) b.busy_ns[d] += per;
}

bool Pipeline::flush_ready_locked(Clock::time_point now, Clock::time_point *deadline) const {
  *deadline = Clock::time_point::max();
  if (stopping_ || batching_.empty()) return false;
  // Enough for a batch, and this executor is idle: no reason to wait.
  if (batching_blocks_ >= min_batch_) return true;
  Clock::time_point due = batching_.front()->batched_at + flush_interval_;
  if (due <= now) return true;
  *deadline = due;
  return false;
}

Pipeline::Batch Pipeline::commit_locked() {
  // P4: a cancel removes its container from batching_ under this same lock, so whatever is
  // still here is uncancelled, and this is the last point a cancel could have applied.
  Batch b;
  size_t blocks = 0;
  while (!batching_.empty()) {
    kvt_xfer *x = batching_.front();
    if (!b.entries.empty() && blocks + x->src.size() > max_batch_) break;
    batching_.pop_front();
    batching_blocks_ -= x->src.size();
    blocks += x->src.size();
    x->state = KVT_XFER_INFLIGHT;
    Entry &e = b.entries.emplace_back();
    e.x = x;
    // P3: upgrade weak references to strong ones. A block evicted since enqueue is dropped.
    Tier *src = m_.tier_if_present(x->src_tier);
    Tier *g1 = m_.tier_if_present(KVT_TIER_G1);
    for (size_t i = 0; i < x->src.size(); ++i) {
      if (src->retain(x->src[i].handle) != KVT_OK) continue;
      if (x->onboard && g1->pin_empty(x->dst_g1[i]) != KVT_OK) {
        m_.release(&x->src[i].handle, 1);
        continue;
      }
      e.items.push_back(i);
    }
  }
  return b;
}

void Pipeline::executor_loop() {
  std::unique_lock lock(mu_);
  while (!stopping_) {
    Clock::time_point deadline;
    if (!flush_ready_locked(Clock::now(), &deadline)) {
      if (deadline == Clock::time_point::max()) exec_cv_.wait(lock);
      else exec_cv_.wait_until(lock, deadline);
      continue;
    }
    Batch b = commit_locked();
    lock.unlock();
    execute(b);
    lock.lock();
    for (int d = 0; d < 5; ++d) stats_[d].busy_ns += uint64_t(b.busy_ns[d]);
    for (Entry &e : b.entries) {
      e.x->count = e.count;
      e.x->final_blocks = std::move(e.final_blocks);
      end_locked(e.x, e.status, std::move(e.message));
    }
  }
}

namespace {
void fail_entry(kvt_status &status, std::string &message, kvt_status st, std::string why) {
  if (status != KVT_OK) return;  // the first failure names the container's
  status = st;
  message = std::move(why);
}
}  // namespace

namespace {
bool on_device(const BlockRef &r) { return r.mem != nullptr && !r.mem->host_visible(); }
}  // namespace

// Runs one phase of copies: host-to-host through the memcpy engine, anything touching CUDA
// memory through the CUDA engine. A failed CUDA copy fails the containers it served.
void Pipeline::run_copies(const std::vector<BlockCopy> &copies, const std::vector<Entry *> &owner) {
  const Geometry &g = m_.geometry();
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
      for (Entry *e : *owners) fail_entry(e->status, e->message, st, last_error());
  }
}

void Pipeline::execute(Batch &b) {
  const Geometry &g = m_.geometry();
  std::vector<BlockCopy> before_disk, after_disk;
  std::vector<Entry *> before_owner, after_owner;
  std::vector<DiskOp> ops;
  std::vector<Entry *> op_owner;

  for (Entry &e : b.entries) {
    kvt_xfer *x = e.x;
    Tier *src = m_.tier_if_present(x->src_tier);
    Tier *dst = m_.tier_if_present(x->dst_tier);
    const size_t n = e.items.size();
    e.op.assign(n, -1);
    if (n == 0) continue;  // nothing left to copy; an empty transfer has no source tier at all
    if (!x->onboard) {
      e.dst.resize(n);
      if (dst->alloc(e.dst.data(), n) != KVT_OK) {
        e.dst.clear();
        fail_entry(e.status, e.message, KVT_ERR_NO_SPACE, last_error());
        continue;
      }
    } else {
      for (size_t i : e.items) e.dst.push_back(x->dst_g1[i]);
    }
    const TierMemory *sm = src->memory().has_bytes() ? &src->memory() : nullptr;
    const TierMemory *dm = dst->memory().has_bytes() ? &dst->memory() : nullptr;
    for (size_t k = 0; k < n; ++k) {
      const SourceRef &r = x->src[e.items[k]];
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
  charge(b, t1 - t0, before_owner);
  charge(b, t2 - t1, op_owner);
  for (Entry &e : b.entries) {
    for (size_t k = 0; k < e.op.size(); ++k)
      if (e.op[k] >= 0 && ops[e.op[k]].status != KVT_OK)
        fail_entry(e.status, e.message, ops[e.op[k]].status, disk_->describe(ops[e.op[k]]));
    if (e.status != KVT_OK || !e.x->onboard || e.staging.empty()) continue;
    // Every block of this onboard read back intact: only now may G1 see the bytes.
    for (size_t k = 0; k < e.items.size(); ++k) {
      after_disk.push_back({{&m_.tier_if_present(KVT_TIER_G1)->memory(),
                             handle::slot(e.dst[k]), nullptr},
                            {nullptr, 0, e.staging[k].get()}});
      after_owner.push_back(&e);
    }
  }
  t2 = Clock::now();
  run_copies(after_disk, after_owner);
  charge(b, Clock::now() - t2, after_owner);

  for (Entry &e : b.entries) {
    kvt_xfer *x = e.x;
    Tier *dst = m_.tier_if_present(x->dst_tier);
    if (x->onboard) {
      e.final_blocks.assign(x->src.size(), 0);
      for (size_t k = 0; k < e.items.size(); ++k) {
        const SourceRef &r = x->src[e.items[k]];
        if (e.status == KVT_OK) {
          dst->commit_onboarded(&e.final_blocks[e.items[k]], e.dst[k], r.hash, r.parent);
          e.count += e.final_blocks[e.items[k]] != 0;
        } else {
          m_.release(&e.dst[k], 1);  // the pipeline's reference; the block stays the caller's
        }
      }
      if (e.status != KVT_OK) e.final_blocks.clear();
    } else if (!e.dst.empty()) {
      for (size_t k = 0; k < e.items.size(); ++k) {
        kvt_block stored = e.dst[k];
        if (e.status == KVT_OK) {
          const SourceRef &r = x->src[e.items[k]];
          dst->register_hash(&stored, e.dst[k], r.hash, r.parent);
          ++e.count;
        }
        m_.release(&stored, 1);  // the copy stays in dst, unreferenced and matchable
      }
    }
    for (size_t i : e.items) m_.release(&x->src[i].handle, 1);  // the strong references
  }
}

}  // namespace kvt
