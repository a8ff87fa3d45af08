#include "pipeline/pipeline.hpp"

#include <absl/container/flat_hash_set.h>

#include <algorithm>

#include "common/error.hpp"
#include "common/log.hpp"
#include "common/names.hpp"

namespace kvt {

namespace {
// Beyond this a timeout is forever: the deadline would overflow the clock.
constexpr int64_t kForever = int64_t{1} << 62;

kvt_xfer *token_of(const Transfer &t) { return reinterpret_cast<kvt_xfer *>(uintptr_t(t.token)); }
}  // namespace

Pipeline::Pipeline(BlockTiers &tiers, const PipelineConfig &c, DiskEngine *disk,
                   CudaEngine *cuda, remote::Store *g4, WorkerPool &pool)
    : tiers_(tiers), g4_(g4), policy_(c, tiers), batcher_(c),
      executor_(tiers, disk, cuda, g4, pool), sweep_interval_(c.sweep_interval) {
  progress_ = std::thread([this] { progress_loop(); });
  for (uint32_t i = 0; i < c.executors; ++i)
    executors_.emplace_back([this] { executor_loop(); });
}

Pipeline::~Pipeline() {
  {
    std::lock_guard lock(intake_mu_);
    stopping_ = true;
  }
  intake_cv_.notify_all();
  progress_.join();
  // Everything not committed is cancelled; committed pieces run to their end below.
  std::vector<std::shared_ptr<Transfer>> live;
  {
    std::lock_guard lock(live_mu_);
    for (auto &[p, t] : live_) live.push_back(t);
  }
  for (auto &t : live) end(*t, KVT_ERR_CANCELLED, "the manager was destroyed");
  batcher_.stop();
  for (auto &t : executors_) t.join();
}

kvt_status Pipeline::transfer_stats(kvt_transfer_stats *out, int src, int dst) {
  std::optional<Direction> d = direction(src, dst);
  if (!d)
    return fail(KVT_ERR_INVALID_ARGUMENT, "kvt_transfer_stats_get: G%d -> G%d is not a "
                "transfer direction", src, dst);
  std::lock_guard lock(stats_mu_);
  *out = stats_[index(*d)];
  out->struct_size = sizeof *out;
  return KVT_OK;
}

Latency Pipeline::latency(Direction d) {
  std::lock_guard lock(stats_mu_);
  return latency_[index(d)];
}

void Pipeline::account(Direction d, kvt_status st, uint64_t blocks, uint64_t busy_ns) {
  std::lock_guard lock(stats_mu_);
  latency_[index(d)].add(busy_ns);
  kvt_transfer_stats &s = stats_[index(d)];
  if (st == KVT_OK) ++s.completed;
  else ++(st == KVT_ERR_CANCELLED ? s.cancelled : s.failed);
  s.blocks += blocks;
  s.bytes += blocks * tiers_.geometry().block_bytes();
  s.busy_ns += busy_ns;
}

// ---- enqueue ----

kvt_status Pipeline::offload(std::shared_ptr<Transfer> *out, const kvt_block *src, size_t n,
                             int dst, uint64_t user_data) {
  if (dst == KVT_TIER_G4 && g4_ == nullptr)
    return fail(KVT_ERR_UNSUPPORTED, "offload to G4: this manager has no G4 (g4_url is NULL)");
  if (dst != KVT_TIER_G4)
    if (kvt_status s = tiers_.present(dst); s != KVT_OK) return s;
  auto t = std::make_shared<Transfer>();
  t->pipe = this;
  t->dst_tier = kvt_tier(dst);
  t->user_data = user_data;
  t->src.resize(n);
  for (size_t i = 0; i < n; ++i) {
    kvt_tier tier{};
    if (kvt_status s = tiers_.tier_of(src[i], &tier); s != KVT_OK) return s;
    if (i == 0) t->src_tier = tier;
    if (tier != t->src_tier)
      return fail(KVT_ERR_INVALID_ARGUMENT, "offload: src[%zu] is in G%d, src[0] in G%d", i,
                  int(tier), int(t->src_tier));
    SourceRef &r = t->src[i];
    r.handle = src[i];
    if (kvt_status s = tiers_.peek(src[i], &r.hash, &r.parent); s != KVT_OK) return s;
  }
  if (n > 0) {
    t->dir = direction(t->src_tier, dst);
    if (!t->dir || info(*t->dir).src > info(*t->dir).dst)
      return fail(
          KVT_ERR_INVALID_ARGUMENT,
          "offload goes down the tiers: G%d to G%d is not an offload (use kvt_xfer_onboard)",
          int(t->src_tier), dst);
  }
  *out = std::move(t);
  return KVT_OK;
}

kvt_status Pipeline::check_dst(Transfer &t, const char *fn, const kvt_block *dst, size_t n) {
  t.dst.assign(dst, dst + n);
  absl::flat_hash_set<kvt_block> seen;
  for (size_t i = 0; i < n; ++i) {
    kvt_tier dt{};
    if (tiers_.tier_of(dst[i], &dt) != KVT_OK || dt != t.dst_tier)
      return fail(KVT_ERR_INVALID_ARGUMENT, "%s: dst[%zu] = 0x%llx is not a G%d block%s", fn, i,
                  (unsigned long long)dst[i], int(t.dst_tier),
                  i > 0 ? " (all destinations are in one tier)" : "");
    if (kvt_status s = tiers_.expect_empty(dst[i]); s != KVT_OK) return s;
    if (!seen.insert(dst[i]).second)
      return fail(KVT_ERR_INVALID_ARGUMENT, "%s: dst[%zu] is listed twice", fn, i);
  }
  return KVT_OK;
}

kvt_status Pipeline::onboard(std::shared_ptr<Transfer> *out, const kvt_block *src,
                             const kvt_block *dst, size_t n, uint64_t user_data) {
  auto t = std::make_shared<Transfer>();
  t->pipe = this;
  t->onboard = true;
  t->dst_tier = KVT_TIER_G1;
  t->user_data = user_data;
  t->src.resize(n);
  for (size_t i = 0; i < n; ++i) {
    kvt_tier tier{};
    if (kvt_status s = tiers_.tier_of(src[i], &tier); s != KVT_OK) return s;
    if (i == 0) t->src_tier = tier;
    if (tier == KVT_TIER_G1 || tier != t->src_tier)
      return fail(KVT_ERR_INVALID_ARGUMENT,
                  "onboard: src[%zu] is in G%d; sources must all be in G2 or all in G3", i,
                  int(tier));
    SourceRef &r = t->src[i];
    r.handle = src[i];
    if (kvt_status s = tiers_.peek(src[i], &r.hash, &r.parent); s != KVT_OK) return s;
  }
  if (kvt_status s = check_dst(*t, "onboard", dst, n); s != KVT_OK) return s;
  if (n > 0) t->dir = direction(t->src_tier, KVT_TIER_G1);
  *out = std::move(t);
  return KVT_OK;
}

kvt_status Pipeline::g4_onboard(std::shared_ptr<Transfer> *out, const uint64_t *hashes,
                                size_t n, uint64_t parent, const kvt_block *dst,
                                uint64_t user_data) {
  static constexpr const char *fn = "kvt_g4_onboard";
  if (g4_ == nullptr)
    return fail(KVT_ERR_UNSUPPORTED, "%s: this manager has no G4 (g4_url is NULL)", fn);
  auto t = std::make_shared<Transfer>();
  t->pipe = this;
  t->onboard = true;
  t->src_tier = KVT_TIER_G4;
  t->dst_tier = KVT_TIER_G1;
  t->user_data = user_data;
  if (n > 0) {
    kvt_tier dt{};
    if (kvt_status s = tiers_.tier_of(dst[0], &dt); s != KVT_OK) return s;
    if (dt != KVT_TIER_G1 && dt != KVT_TIER_G2)
      return fail(KVT_ERR_INVALID_ARGUMENT, "%s: dst[0] is a G%d block: G1 or G2 only", fn,
                  int(dt));
    t->dst_tier = dt;
    t->dir = direction(KVT_TIER_G4, dt);
  }
  t->src.resize(n);
  for (size_t i = 0; i < n; ++i) t->src[i] = {0, hashes[i], i == 0 ? parent : hashes[i - 1]};
  if (kvt_status s = check_dst(*t, fn, dst, n); s != KVT_OK) return s;
  *out = std::move(t);
  return KVT_OK;
}

kvt_status Pipeline::enqueue(const std::shared_ptr<Transfer> &t,
                             const std::shared_ptr<Fence> &f) {
  if (f != nullptr && f->pipe != this)
    return fail(KVT_ERR_INVALID_HANDLE, "the precondition is not a live fence of this manager");
  t->fence = f;
  {
    std::lock_guard lock(live_mu_);
    live_.emplace(t.get(), t);
  }
  if (t->onboard) {
    precondition(t);  // onboards skip the policy stage
  } else {
    {
      std::lock_guard lock(intake_mu_);
      intake_.push_back(t);
    }
    intake_cv_.notify_one();
  }
  return KVT_OK;
}

// ---- the stages before commitment, on the progress thread ----

void Pipeline::progress_loop() {
  for (;;) {
    std::shared_ptr<Transfer> t;
    {
      std::unique_lock lock(intake_mu_);
      auto ready = [&] { return stopping_ || !intake_.empty(); };
      if (precondition_.cuda_waiting()) intake_cv_.wait_for(lock, sweep_interval_, ready);
      else intake_cv_.wait(lock, ready);
      if (stopping_) return;
      if (!intake_.empty()) {
        t = std::move(intake_.front());
        intake_.pop_front();
      }
    }
    if (t) evaluate(t);
    for (auto &w : precondition_.poll_cuda()) to_batcher(w);
  }
}

void Pipeline::evaluate(const std::shared_ptr<Transfer> &t) {
  {
    std::lock_guard lock(t->mu);
    if (t->ended()) return;  // cancelled while queued
    t->state = KVT_XFER_EVALUATING;
  }
  std::vector<uint64_t> reserved;
  if (!t->src.empty()) reserved = policy_.evaluate(*t);
  {
    std::unique_lock lock(t->mu);
    if (t->ended()) {  // cancelled while evaluated
      lock.unlock();
      policy_.unreserve(t->dst_tier, reserved);
      return;
    }
    t->reserved = std::move(reserved);
  }
  if (t->src.empty()) {
    end(*t, KVT_OK, "");
    return;
  }
  precondition(t);
}

void Pipeline::precondition(const std::shared_ptr<Transfer> &t) {
  switch (precondition_.admit(t)) {
    case PreconditionStage::Outcome::Proceed:
      to_batcher(t);
      break;
    case PreconditionStage::Outcome::Parked:
      if (t->fence->cuda_event != nullptr) {
        { std::lock_guard lock(intake_mu_); }  // the progress thread is waiting, or will see it
        intake_cv_.notify_one();
      }
      break;
    case PreconditionStage::Outcome::FenceGone:
      end(*t, KVT_ERR_CANCELLED, "its precondition fence was destroyed unsignalled");
      break;
    case PreconditionStage::Outcome::Ended:
      break;
  }
}

void Pipeline::to_batcher(const std::shared_ptr<Transfer> &t) {
  {
    std::lock_guard lock(t->mu);
    if (t->ended()) return;
    t->state = KVT_XFER_BATCHED;
  }
  if (t->src.empty()) {
    end(*t, KVT_OK, "");
    return;
  }
  batcher_.add(t);
}

// ---- commitment and copies, on the executor threads ----

void Pipeline::executor_loop() {
  std::vector<Piece> batch;
  while (batcher_.next(&batch)) {
    std::shared_lock gate(in_flight_);
    double busy_ns[kDirections] = {};
    std::vector<Executor::Result> results = executor_.run(batch, busy_ns);
    {
      std::lock_guard lock(stats_mu_);
      for (size_t d = 0; d < kDirections; ++d) stats_[d].busy_ns += uint64_t(busy_ns[d]);
    }
    std::vector<std::string> failures;
    for (size_t i = 0; i < batch.size(); ++i)
      if (results[i].committed) piece_done(batch[i], results[i], &failures);
    gate.unlock();
    for (const std::string &f : failures)  // outside every lock: the callback may call back
      log(KVT_LOG_WARN, "%s", f.c_str());
  }
}

void Pipeline::piece_done(const Piece &p, Executor::Result &r,
                          std::vector<std::string> *failures) {
  Transfer &t = *p.t;
  std::lock_guard lock(t.mu);
  t.count += r.count;
  // The first failure in time; from G4, the first in chain order.
  if (r.status != KVT_OK && (t.piece_status == KVT_OK || r.fail_item < t.fail_item)) {
    t.piece_status = r.status;
    t.piece_message = std::move(r.message);
    t.fail_item = r.fail_item;
  }
  t.landed.insert(t.landed.end(), r.landed.begin(), r.landed.end());
  if (--t.pieces_left > 0) {
    parked_pins_ += r.landed.size();
    return;
  }
  parked_pins_ -= t.landed.size() - r.landed.size();
  // Registered under t.mu: a release either came before (and no block is pinned for a host
  // that could never read its handle), or finds the transfer ended.
  if (t.onboard && t.piece_status != KVT_OK && t.src_tier == KVT_TIER_G4) {
    // From G4, the blocks before the first failure are registered (none dedup onto a block
    // pinned for the host: a failed transfer hands out no final handles); the rest go back.
    std::vector<kvt_block> back;
    std::erase_if(t.landed, [&](const Transfer::Landed &l) {
      if (l.item < t.fail_item) return false;
      back.push_back(l.g1);
      return true;
    });
    tiers_.release(back.data(), back.size());
    const size_t n = t.landed.size();
    std::vector<kvt_block> g1(n), out(n);
    std::vector<uint64_t> hash(n), parent(n);
    for (size_t k = 0; k < n; ++k) {
      g1[k] = t.landed[k].g1;
      hash[k] = t.src[t.landed[k].item].hash;
      parent[k] = t.src[t.landed[k].item].parent;
    }
    tiers_.commit_onboarded(out.data(), g1.data(), hash.data(), parent.data(), n, false);
    for (size_t k = 0; k < n; ++k) t.count += out[k] != 0;
    t.landed.clear();
  }
  if (t.onboard && !t.landed.empty()) {
    const size_t n = t.landed.size();
    std::vector<kvt_block> g1(n), out(n);
    for (size_t k = 0; k < n; ++k) g1[k] = t.landed[k].g1;
    if (t.piece_status == KVT_OK) {
      std::vector<uint64_t> hash(n), parent(n);
      for (size_t k = 0; k < n; ++k) {
        hash[k] = t.src[t.landed[k].item].hash;
        parent[k] = t.src[t.landed[k].item].parent;
      }
      tiers_.commit_onboarded(out.data(), g1.data(), hash.data(), parent.data(), n,
                              t.host_holds);
      t.final_blocks.assign(t.src.size(), 0);
      for (size_t k = 0; k < n; ++k) {
        t.final_blocks[t.landed[k].item] = out[k];
        t.count += out[k] != 0;
        if (out[k] != 0 && out[k] != g1[k]) t.unread_dedups.push_back(t.landed[k].item);
      }
      parked_pins_ += t.unread_dedups.size();
    } else {
      tiers_.release(g1.data(), n);  // the pins; the blocks stay Empty and the caller's
    }
    t.landed.clear();
  }
  if (t.piece_status != KVT_OK)
    failures->push_back(std::string("a ") + info(*t.dir).name + " transfer failed (" +
                        status_name(t.piece_status) + "): " + t.piece_message);
  end_locked(t, t.piece_status, std::move(t.piece_message));
}

// ---- the end of a transfer ----

bool Pipeline::end(Transfer &t, kvt_status st, std::string message, bool committed_ok) {
  std::lock_guard lock(t.mu);
  if (!committed_ok && t.state == KVT_XFER_INFLIGHT) return false;  // it finishes
  return end_locked(t, st, std::move(message));
}

bool Pipeline::end_locked(Transfer &t, kvt_status st, std::string message) {
  if (t.ended()) return false;
  // Before anyone can see the end: an offload of the same blocks issued right after a wait
  // returns must not be filtered out by this transfer's presence marks.
  policy_.unreserve(t.dst_tier, t.reserved);
  t.reserved.clear();
  t.state = st == KVT_OK ? KVT_XFER_DONE
            : st == KVT_ERR_CANCELLED ? KVT_XFER_CANCELLED : KVT_XFER_FAILED;
  t.result = st;
  t.message = std::move(message);
  const uint64_t took_ns = uint64_t(
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t.created).count());
  if (t.dir) {
    std::lock_guard lock(stats_mu_);
    latency_[index(*t.dir)].add(took_ns);
    kvt_transfer_stats &s = stats_[index(*t.dir)];
    if (st == KVT_OK) {
      ++s.completed;
      s.blocks += t.count;
      s.bytes += t.count * tiers_.geometry().block_bytes();
    } else {
      ++(st == KVT_ERR_CANCELLED ? s.cancelled : s.failed);
    }
  }
  if (t.dir && tiers_.obs().on()) {
    ObsEvent e = obs_event(KVT_OBS_TRANSFER);
    e.src = t.src_tier;
    e.dst = t.dst_tier;
    e.status = st;
    e.blocks = st == KVT_OK ? t.count : 0;
    e.bytes = e.blocks * tiers_.geometry().block_bytes();
    e.duration_ns = took_ns;
    tiers_.obs().emit(e);
  }
  if (t.host_holds) {  // under t.mu, so that a release withdraws it or prevents it
    kvt_event e{};
    e.type = KVT_EVENT_XFER_DONE;
    e.status = st;
    e.tier = t.dst_tier;
    e.xfer = token_of(t);
    e.user_data = t.user_data;
    e.count = t.count;
    tiers_.events().push(&e, 1);
  }
  t.ended_cv.notify_all();
  {
    std::lock_guard lock(live_mu_);
    live_.erase(&t);  // every caller holds its own reference to t
  }
  return true;
}

// ---- the host's calls on a transfer ----

kvt_status Pipeline::cancel(Transfer &t) {
  end(t, KVT_ERR_CANCELLED, "cancelled by the host");
  return KVT_OK;
}

kvt_status Pipeline::wait(Transfer &t, int64_t timeout_ns) {
  std::unique_lock lock(t.mu);
  auto ended = [&] { return t.ended(); };
  if (timeout_ns < 0 || timeout_ns >= kForever) {
    t.ended_cv.wait(lock, ended);
  } else if (!t.ended_cv.wait_for(lock, std::chrono::nanoseconds(timeout_ns), ended)) {
    return fail(KVT_TIMEOUT, "kvt_xfer_wait: the transfer did not end within %lld ns",
                (long long)timeout_ns);
  }
  if (t.result != KVT_OK) return fail(t.result, "%s", t.message.c_str());
  return KVT_OK;
}

kvt_status Pipeline::status(uint32_t *state, kvt_status *result, uint64_t *count,
                            Transfer &t) {
  std::lock_guard lock(t.mu);
  if (state) *state = t.state;
  if (result) *result = t.result;
  if (count) *count = t.count;
  if (t.ended() && t.result != KVT_OK) fail(t.result, "%s", t.message.c_str());
  return KVT_OK;
}

kvt_status Pipeline::blocks(kvt_block *out, size_t n, Transfer &t) {
  std::shared_lock gate(in_flight_);  // it may hand over pins: check_refs must not look then
  std::lock_guard lock(t.mu);
  if (!t.onboard)
    return fail(KVT_ERR_STATE, "kvt_xfer_blocks: the transfer is an offload, not an onboard");
  if (t.state != KVT_XFER_DONE)
    return fail(KVT_ERR_STATE, "kvt_xfer_blocks: the onboard has not ended with KVT_OK");
  if (n != t.src.size())
    return fail(KVT_ERR_INVALID_ARGUMENT, "kvt_xfer_blocks: n is %zu, the onboard had %zu", n,
                t.src.size());
  if (!t.unread_dedups.empty()) {  // the host takes the blocks pinned for it
    std::vector<kvt_block> replaced;
    for (size_t i : t.unread_dedups) replaced.push_back(t.dst[i]);
    tiers_.hand_over(replaced.data(), replaced.size());
    parked_pins_ -= replaced.size();
    t.unread_dedups.clear();
  }
  if (!t.final_blocks.empty()) std::copy(t.final_blocks.begin(), t.final_blocks.end(), out);
  else std::fill(out, out + n, kvt_block{0});
  return KVT_OK;
}

void Pipeline::release(Transfer &t) {
  {
    std::shared_lock gate(in_flight_);  // as in blocks()
    std::lock_guard lock(t.mu);
    t.host_holds = false;
    tiers_.events().withdraw(token_of(t));
    if (!t.ended() && t.state != KVT_XFER_INFLIGHT)
      end_locked(t, KVT_ERR_CANCELLED, "released by the host");  // emits nothing
    if (!t.unread_dedups.empty()) {  // never read: the caller keeps its own blocks
      std::vector<kvt_block> pinned;
      for (size_t i : t.unread_dedups) pinned.push_back(t.final_blocks[i]);
      tiers_.release(pinned.data(), pinned.size());
      parked_pins_ -= pinned.size();
      t.unread_dedups.clear();
    }
  }
}

void Pipeline::drain(unsigned tiers) {
  std::vector<std::shared_ptr<Transfer>> touching;
  {
    std::lock_guard lock(live_mu_);
    for (auto &[p, t] : live_)  // the tiers are set before enqueue, read-only since
      if (tiers & ((1u << t->src_tier) | (1u << t->dst_tier))) touching.push_back(t);
  }
  for (auto &t : touching) end(*t, KVT_ERR_CANCELLED, "its tier was reset");
  for (auto &t : touching) {  // committed: their copies run to the end
    std::unique_lock lock(t->mu);
    t->ended_cv.wait(lock, [&] { return t->ended(); });
  }
}

// ---- fences ----

kvt_status Pipeline::fence_create(std::shared_ptr<Fence> *out, void *cuda_event) {
  auto f = std::make_shared<Fence>();
  f->pipe = this;
  f->cuda_event = cuda_event;
  *out = std::move(f);
  return KVT_OK;
}

kvt_status Pipeline::fence_signal(Fence &f) {
  for (auto &t : precondition_.signal(f)) to_batcher(t);
  return KVT_OK;
}

void Pipeline::fence_destroy(Fence &f) {
  for (auto &t : precondition_.destroy(f))
    end(*t, KVT_ERR_CANCELLED, "its precondition fence was destroyed unsignalled");
}

// ---- accounting ----

kvt_status Pipeline::check_refs() {
  std::unique_lock gate(in_flight_, std::defer_lock);
  if (!gate.try_lock_for(std::chrono::milliseconds(100))) return KVT_OK;  // busy: no verdict
  uint64_t held = tiers_.pipeline_refs(), expected = parked_pins_.load();
  if (held != expected)
    return fail(KVT_ERR_INTERNAL,
                "pipeline invariant violated: it holds %llu block references with no batch "
                "in flight, %llu expected",
                (unsigned long long)held, (unsigned long long)expected);
  return KVT_OK;
}

}  // namespace kvt
