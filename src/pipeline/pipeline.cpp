#include "pipeline/pipeline.hpp"

#include <algorithm>

#include "common/error.hpp"
#include "manager/manager.hpp"
#include "memory/cuda.hpp"

namespace kvt {

namespace {
using std::chrono::microseconds;
// Offer counts kept for the frequency policy; past this many hashes they are halved, so
// that old popularity fades (as in TinyLFU).
constexpr size_t kMaxOffered = size_t{1} << 20;
}  // namespace

Pipeline::Pipeline(Manager &m, const kvt_manager_config &c, DiskEngine *disk, CudaEngine *cuda,
                   WorkerPool &pool)
    : m_(m), disk_(disk), cuda_(cuda), pool_(pool), max_batch_(c.max_batch_size),
      min_batch_(c.min_batch_size), flush_interval_(microseconds(c.flush_interval_us)),
      policy_timeout_(microseconds(c.policy_timeout_us)),
      sweep_interval_(microseconds(c.sweep_interval_us)),
      policies_{c.policy_g1_g2, c.policy_g1_g3, c.policy_g2_g3} {
  progress_ = std::thread([this] { progress_loop(); });
  for (uint32_t i = 0; i < c.max_concurrent_transfers; ++i)
    executors_.emplace_back([this] { executor_loop(); });
}

Pipeline::~Pipeline() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
    // Everything not committed is cancelled; committed batches finish below.
    std::vector<kvt_xfer *> pending;
    for (auto &[x, owned] : xfers_)
      if (!x->ended() && x->state != KVT_XFER_INFLIGHT) pending.push_back(x);
    for (kvt_xfer *x : pending) end_locked(x, KVT_ERR_CANCELLED, "the manager was destroyed");
  }
  progress_cv_.notify_all();
  exec_cv_.notify_all();
  progress_.join();
  for (auto &t : executors_) t.join();
}

int Pipeline::direction(int src, int dst) noexcept {
  if (src == KVT_TIER_G1) return dst == KVT_TIER_G2 ? 0 : dst == KVT_TIER_G3 ? 1 : -1;
  if (dst == KVT_TIER_G1) return src == KVT_TIER_G2 ? 3 : src == KVT_TIER_G3 ? 4 : -1;
  return src == KVT_TIER_G2 && dst == KVT_TIER_G3 ? 2 : -1;
}

kvt_status Pipeline::transfer_stats(kvt_transfer_stats *out, int src, int dst) {
  int d = direction(src, dst);
  if (d < 0)
    return fail(KVT_ERR_INVALID_ARGUMENT, "kvt_transfer_stats_get: G%d -> G%d is not a "
                "transfer direction", src, dst);
  std::lock_guard lock(mu_);
  *out = stats_[d];
  out->struct_size = sizeof *out;
  return KVT_OK;
}

const kvt_policy &Pipeline::policy(kvt_tier src, kvt_tier dst) const {
  if (src == KVT_TIER_G1) return policies_[dst == KVT_TIER_G2 ? 0 : 1];
  return policies_[2];
}

// ---- enqueue ----

kvt_status Pipeline::offload(kvt_xfer **out, const kvt_block *src, size_t n, int dst,
                             kvt_fence *f, uint64_t user_data) {
  Tier *dst_tier = m_.tier(dst);
  if (dst_tier == nullptr) return KVT_ERR_INVALID_ARGUMENT;
  auto x = std::make_unique<kvt_xfer>();
  x->pipe = this;
  x->dst_tier = dst_tier->id();
  x->user_data = user_data;
  x->src.resize(n);
  for (size_t i = 0; i < n; ++i) {
    Tier *t = m_.tier_of(src[i]);
    if (t == nullptr) return KVT_ERR_INVALID_HANDLE;
    if (i == 0) x->src_tier = t->id();
    if (t->id() != x->src_tier)
      return fail(KVT_ERR_INVALID_ARGUMENT, "offload: src[%zu] is in G%d, src[0] in G%d", i,
                  int(t->id()), int(x->src_tier));
    SourceRef &r = x->src[i];
    r.handle = src[i];
    if (kvt_status s = t->peek_registered(src[i], &r.hash, &r.parent); s != KVT_OK) return s;
  }
  if (n > 0 && x->src_tier >= dst)
    return fail(KVT_ERR_INVALID_ARGUMENT,
                "offload goes down the tiers: G%d to G%d is not an offload (use kvt_onboard)",
                int(x->src_tier), int(dst));
  return enqueue(out, std::move(x), f);
}

kvt_status Pipeline::onboard(kvt_xfer **out, const kvt_block *src, const kvt_block *dst_g1,
                             size_t n, kvt_fence *f, uint64_t user_data) {
  Tier *g1 = m_.tier(KVT_TIER_G1);
  auto x = std::make_unique<kvt_xfer>();
  x->pipe = this;
  x->onboard = true;
  x->dst_tier = KVT_TIER_G1;
  x->user_data = user_data;
  x->src.resize(n);
  x->dst_g1.assign(dst_g1, dst_g1 + n);
  absl::flat_hash_set<kvt_block> seen;
  for (size_t i = 0; i < n; ++i) {
    Tier *t = m_.tier_of(src[i]);
    if (t == nullptr) return KVT_ERR_INVALID_HANDLE;
    if (i == 0) x->src_tier = t->id();
    if (t->id() == KVT_TIER_G1 || t->id() != x->src_tier)
      return fail(KVT_ERR_INVALID_ARGUMENT,
                  "onboard: src[%zu] is in G%d; sources must all be in G2 or all in G3", i,
                  int(t->id()));
    SourceRef &r = x->src[i];
    r.handle = src[i];
    if (kvt_status s = t->peek_registered(src[i], &r.hash, &r.parent); s != KVT_OK) return s;
    if (m_.tier_of(dst_g1[i]) != g1)
      return fail(KVT_ERR_INVALID_ARGUMENT, "onboard: dst_g1[%zu] = 0x%llx is not a G1 block",
                  i, (unsigned long long)dst_g1[i]);
    if (kvt_status s = g1->expect_empty(dst_g1[i]); s != KVT_OK) return s;
    if (!seen.insert(dst_g1[i]).second)
      return fail(KVT_ERR_INVALID_ARGUMENT, "onboard: dst_g1[%zu] is listed twice", i);
  }
  return enqueue(out, std::move(x), f);
}

kvt_status Pipeline::enqueue(kvt_xfer **out, std::unique_ptr<kvt_xfer> owned, kvt_fence *f) {
  std::lock_guard lock(mu_);
  if (f != nullptr && (f->magic != kvt_fence::kMagic || f->pipe != this || !f->host_holds))
    return fail(KVT_ERR_INVALID_HANDLE, "the precondition is not a live fence of this manager");
  kvt_xfer *x = owned.get();
  xfers_.emplace(x, std::move(owned));
  if (f != nullptr) {
    x->fence = f;
    ++f->users;
  }
  *out = x;
  if (x->onboard) {
    precondition_locked(x);  // onboards skip the policy stage
  } else {
    intake_.push_back(x);
    progress_cv_.notify_one();
  }
  return KVT_OK;
}

// ---- stages before commitment ----

void Pipeline::evaluate_locked(kvt_xfer *x) {
  x->state = KVT_XFER_EVALUATING;
  const kvt_policy &p = policy(x->src_tier, x->dst_tier);
  auto &offered = offered_[&p - policies_];
  auto &inflight = inflight_[x->dst_tier];
  Tier *dst = m_.tier_if_present(x->dst_tier);
  const auto deadline = Clock::now() + policy_timeout_;
  std::vector<SourceRef> kept;
  kept.reserve(x->src.size());
  for (size_t i = 0; i < x->src.size(); ++i) {
    if (i % 64 == 63 && Clock::now() > deadline) break;  // the rest is not offloaded
    const SourceRef &r = x->src[i];
    if (p.flags & KVT_POLICY_FREQUENCY) {
      if (offered.size() >= kMaxOffered) {
        for (auto it = offered.begin(); it != offered.end();) {
          if ((it->second /= 2) == 0) offered.erase(it++); else ++it;
        }
      }
      if (++offered[r.hash] < p.min_frequency) continue;
    }
    if ((p.flags & KVT_POLICY_PRESENCE) && (inflight.contains(r.hash) || dst->contains(r.hash)))
      continue;
    ++inflight[r.hash];
    x->reserved.push_back(r.hash);
    kept.push_back(r);
  }
  x->src.swap(kept);
  if (x->src.empty()) {
    end_locked(x, KVT_OK, "");
    return;
  }
  precondition_locked(x);
}

void Pipeline::precondition_locked(kvt_xfer *x) {
  kvt_fence *f = x->fence;
  if (f != nullptr && !f->signalled) {
    if (!f->host_holds) {
      end_locked(x, KVT_ERR_CANCELLED, "its precondition fence was destroyed unsignalled");
      return;
    }
    x->state = KVT_XFER_WAITING;
    f->waiters.push_back(x);
    if (f->cuda_event != nullptr) {
      ++cuda_fences_waiting_;
      progress_cv_.notify_one();
    }
    return;
  }
  leave_fence_locked(x);
  x->state = KVT_XFER_BATCHED;
  x->batched_at = Clock::now();
  batching_.push_back(x);
  batching_blocks_ += x->src.size();
  exec_cv_.notify_one();
}

void Pipeline::leave_fence_locked(kvt_xfer *x) {
  kvt_fence *f = x->fence;
  if (f == nullptr) return;
  x->fence = nullptr;
  --f->users;
  maybe_free_fence_locked(f);
}

void Pipeline::maybe_free_fence_locked(kvt_fence *f) {
  if (!f->host_holds && f->users == 0) {
    f->magic = 0;
    fences_.erase(f);
  }
}

void Pipeline::progress_loop() {
  std::unique_lock lock(mu_);
  while (!stopping_) {
    while (!intake_.empty()) {
      kvt_xfer *x = intake_.front();
      intake_.pop_front();
      evaluate_locked(x);
    }
    if (cuda_fences_waiting_ > 0) {
      std::vector<kvt_fence *> done;
      for (auto &[f, owned] : fences_)
        if (f->cuda_event != nullptr && !f->signalled && !f->waiters.empty() &&
            cuda::event_done(f->cuda_event))
          done.push_back(f);
      for (kvt_fence *f : done) signal_locked(f);
      progress_cv_.wait_for(lock, sweep_interval_);
    } else {
      progress_cv_.wait(lock, [&] { return stopping_ || !intake_.empty() || cuda_fences_waiting_; });
    }
  }
}

// ---- cancellation, waiting, release ----

void Pipeline::end_locked(kvt_xfer *x, kvt_status st, std::string message) {
  switch (x->state) {  // leave whatever stage still lists it
    case KVT_XFER_QUEUED:
      intake_.erase(std::find(intake_.begin(), intake_.end(), x));
      break;
    case KVT_XFER_WAITING: {
      auto &w = x->fence->waiters;
      w.erase(std::find(w.begin(), w.end(), x));
      if (x->fence->cuda_event != nullptr) --cuda_fences_waiting_;
      break;
    }
    case KVT_XFER_BATCHED:
      batching_.erase(std::find(batching_.begin(), batching_.end(), x));
      batching_blocks_ -= x->src.size();
      break;
    default:
      break;
  }
  leave_fence_locked(x);
  for (uint64_t h : x->reserved) unreserve_locked(x->dst_tier, h);
  x->reserved.clear();
  x->state = st == KVT_OK ? KVT_XFER_DONE
             : st == KVT_ERR_CANCELLED ? KVT_XFER_CANCELLED : KVT_XFER_FAILED;
  if (int d = direction(x->src_tier, x->dst_tier); d >= 0) {
    kvt_transfer_stats &t = stats_[d];
    if (st == KVT_OK) {
      ++t.completed;
      t.blocks += x->count;
      t.bytes += x->count * m_.block_bytes();
    } else {
      ++(st == KVT_ERR_CANCELLED ? t.cancelled : t.failed);
    }
  }
  x->result = st;
  x->message = std::move(message);
  done_cv_.notify_all();
  if (!x->host_holds) {
    xfers_.erase(x);
    return;
  }
  kvt_event e{};
  e.type = KVT_EVENT_XFER_DONE;
  e.status = st;
  e.tier = x->dst_tier;
  e.xfer = x;
  e.user_data = x->user_data;
  e.count = x->count;
  m_.events().push(&e, 1);
}

void Pipeline::unreserve_locked(kvt_tier dst, uint64_t hash) {
  auto it = inflight_[dst].find(hash);
  if (it != inflight_[dst].end() && --it->second == 0) inflight_[dst].erase(it);
}

kvt_status Pipeline::cancel(kvt_xfer *x) {
  std::lock_guard lock(mu_);
  if (x->ended() || x->state == KVT_XFER_INFLIGHT) return KVT_OK;  // committed: it finishes
  end_locked(x, KVT_ERR_CANCELLED, "cancelled by the host");
  return KVT_OK;
}

kvt_status Pipeline::wait(kvt_xfer *x, int64_t timeout_ns) {
  std::unique_lock lock(mu_);
  auto ended = [&] { return x->ended(); };
  if (timeout_ns < 0) {
    done_cv_.wait(lock, ended);
  } else if (!done_cv_.wait_for(lock, std::chrono::nanoseconds(timeout_ns), ended)) {
    return KVT_TIMEOUT;
  }
  if (x->result != KVT_OK) return fail(x->result, "%s", x->message.c_str());
  return KVT_OK;
}

kvt_status Pipeline::status(uint32_t *state, kvt_status *result, uint64_t *count,
                            kvt_xfer *x) {
  std::lock_guard lock(mu_);
  if (state) *state = x->state;
  if (result) *result = x->result;
  if (count) *count = x->count;
  if (x->ended() && x->result != KVT_OK) fail(x->result, "%s", x->message.c_str());
  return KVT_OK;
}

kvt_status Pipeline::blocks(kvt_block *out, size_t n, kvt_xfer *x) {
  std::lock_guard lock(mu_);
  if (!x->onboard)
    return fail(KVT_ERR_STATE, "kvt_xfer_blocks: the transfer is an offload, not an onboard");
  if (x->state != KVT_XFER_DONE)
    return fail(KVT_ERR_STATE, "kvt_xfer_blocks: the onboard has not ended with KVT_OK");
  if (n != x->final_blocks.size())
    return fail(KVT_ERR_INVALID_ARGUMENT, "kvt_xfer_blocks: n is %zu, the onboard had %zu",
                n, x->final_blocks.size());
  std::copy(x->final_blocks.begin(), x->final_blocks.end(), out);
  return KVT_OK;
}

void Pipeline::release(kvt_xfer *x) {
  std::lock_guard lock(mu_);
  x->host_holds = false;
  m_.events().withdraw(x);
  if (x->ended()) {
    x->magic = 0;
    xfers_.erase(x);
  } else if (x->state != KVT_XFER_INFLIGHT) {
    end_locked(x, KVT_ERR_CANCELLED, "released by the host");  // frees it, emits nothing
  }
  // In flight: the executor frees it when the copy ends.
}

// ---- fences ----

kvt_status Pipeline::fence_create(kvt_fence **out, void *cuda_event) {
  auto f = std::make_unique<kvt_fence>();
  f->pipe = this;
  f->cuda_event = cuda_event;
  std::lock_guard lock(mu_);
  *out = f.get();
  fences_.emplace(f.get(), std::move(f));
  return KVT_OK;
}

void Pipeline::signal_locked(kvt_fence *f) {
  f->signalled = true;
  std::vector<kvt_xfer *> ready;
  ready.swap(f->waiters);
  if (f->cuda_event != nullptr) cuda_fences_waiting_ -= ready.size();
  for (kvt_xfer *x : ready) precondition_locked(x);
}

kvt_status Pipeline::fence_signal(kvt_fence *f) {
  std::lock_guard lock(mu_);
  if (!f->signalled) signal_locked(f);
  return KVT_OK;
}

void Pipeline::fence_destroy(kvt_fence *f) {
  std::lock_guard lock(mu_);
  f->host_holds = false;
  ++f->users;  // keeps f alive while its waiters leave it
  if (!f->signalled) {
    std::vector<kvt_xfer *> waiting = f->waiters;
    for (kvt_xfer *x : waiting)
      end_locked(x, KVT_ERR_CANCELLED, "its precondition fence was destroyed unsignalled");
  }
  --f->users;
  maybe_free_fence_locked(f);
}

}  // namespace kvt
