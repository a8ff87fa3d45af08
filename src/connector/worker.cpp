#include "connector/worker.hpp"

#include <algorithm>
#include <chrono>

#include "block/tier.hpp"
#include "common/error.hpp"
#include "connector/scheduler.hpp"
#include "manager/manager.hpp"
#include "memory/cuda.hpp"
#include "memory/mapping.hpp"
#include "copy/copy_set.hpp"
#include "copy/cuda_engine.hpp"
#include "copy/disk_engine.hpp"

namespace kvt::conn {

Worker::Worker(Manager &m, uint32_t world_size, uint32_t rank, bool stores_end_by_next_step)
    : m_(m),
      shape_(shape_of(m, world_size)),
      rank_(rank),
      stores_end_by_next_step_(stores_end_by_next_step) {
  thread_ = std::thread([this] { run(); });
}

Worker::~Worker() {
  {
    std::lock_guard lk(mu_);
    if (meta_) {  // a step bound and never cleared: its copies still run, nothing is lost
      start_stores();
      open_all_layers();
      meta_.reset();
    }
    stop_ = true;
  }
  work_cv_.notify_all();
  thread_.join();
}

kvt_status Worker::register_kv_caches(const kvt_g1_layout &l, uint64_t num_blocks) {
  static constexpr const char *fn = "kvt_connector_register_kv_caches";
  std::lock_guard lk(mu_);
  if (g1_blocks_ != 0) return fail(KVT_ERR_STATE, "%s: the KV caches are registered already", fn);
  if (num_blocks == 0 || num_blocks > KVT_MAX_TIER_BLOCKS)
    return fail(KVT_ERR_INVALID_ARGUMENT, "%s: num_blocks %llu is not in 1..%llu", fn,
                (unsigned long long)num_blocks, (unsigned long long)KVT_MAX_TIER_BLOCKS);
  const Geometry &g = m_.geometry();
  if (g.block_bytes() == 0)
    return fail(KVT_ERR_INVALID_ARGUMENT, "%s: the manager's blocks hold no bytes (chunk_bytes 0)",
                fn);
  if (l.memory != KVT_MEMORY_HOST && l.memory != KVT_MEMORY_CUDA)
    return fail(KVT_ERR_INVALID_ARGUMENT, "%s: layout->memory %u is neither HOST nor CUDA", fn,
                l.memory);
  if (l.reserved != 0) return fail(KVT_ERR_INVALID_ARGUMENT, "%s: layout->reserved must be 0", fn);
  if (l.bases == nullptr || l.strides == nullptr)
    return fail(KVT_ERR_INVALID_ARGUMENT, "%s: layout->bases and layout->strides must be set", fn);
  size_t pairs = size_t{g.num_layers} * g.num_outer;
  for (size_t i = 0; i < pairs; ++i) {
    if (l.bases[i] == nullptr)
      return fail(KVT_ERR_INVALID_ARGUMENT, "%s: layout->bases[%zu] is NULL", fn, i);
    if (l.strides[i] < g.chunk_bytes)
      return fail(KVT_ERR_INVALID_ARGUMENT,
                  "%s: layout->strides[%zu] is %llu, less than chunk_bytes %llu", fn, i,
                  (unsigned long long)l.strides[i], (unsigned long long)g.chunk_bytes);
  }
  if (l.memory == KVT_MEMORY_CUDA) {
    if (!cuda::device_present(l.cuda_device))
      return fail(KVT_ERR_UNSUPPORTED, "%s: the layout is CUDA memory on device %d, which kvtier "
                  "cannot use", fn, l.cuda_device);
    if (kvt_status s = TierMemory::check_on_device(g, l, num_blocks, "layout"); s != KVT_OK)
      return s;
    if (kvt_status s = CudaEngine::create(&cuda_, l.cuda_device,
                                          kvt_cuda_copy(m_.config().cuda_copy), g.chunk_bytes);
        s != KVT_OK)
      return s;
    if (Tier *g2 = m_.tier_if_present(KVT_TIER_G2))
      cuda_->map_host(g2->memory().pinned_base(), g2->memory().bytes());
  }
  g1_.init_engine(g, l);
  g1_blocks_ = num_blocks;
  return KVT_OK;
}

kvt_status Worker::bound(const char *fn) const {
  if (!meta_) return fail(KVT_ERR_STATE, "%s: no metadata is bound", fn);
  return KVT_OK;
}

kvt_status Worker::bind(const void *bytes, size_t len) {
  static constexpr const char *fn = "kvt_connector_bind_connector_metadata";
  Meta meta;
  if (kvt_status s = decode(&meta, bytes, len); s != KVT_OK)
    return fail(s, "%s: %s", fn, std::string(last_error()).c_str());
  if (kvt_status e = check_shape(fn, "metadata", meta.shape, shape_); e != KVT_OK) return e;
  std::lock_guard lk(mu_);
  if (meta_) return fail(KVT_ERR_STATE, "%s: a metadata is bound already: clear it first", fn);
  if (g1_blocks_ == 0)
    return fail(KVT_ERR_STATE, "%s: register_kv_caches must come before the first bind", fn);
  for (const auto *list : {&meta.lazy_stores, &meta.loads, &meta.stores})
    for (const Batch &b : *list)
      for (const CopyOp &op : b.ops)
        if (op.g1 >= g1_blocks_)
          return fail(KVT_ERR_CORRUPT,
                      "%s: the metadata names G1 block %u, but the engine registered %llu", fn,
                      op.g1, (unsigned long long)g1_blocks_);
  meta_ = std::move(meta);
  loads_started_ = stores_started_ = false;
  ++binds_;
  saved_.assign(m_.geometry().num_layers, false);
  prior_stores_ = last_store_;
  for (const auto *list : {&meta_->lazy_stores, &meta_->loads, &meta_->stores})
    for (const Batch &b : *list) ++unstarted_[b.req_id];
  for (std::string &id : meta_->finished) finishing_.insert(std::move(id));
  meta_->finished.clear();
  announce_finished();
  return KVT_OK;
}

kvt_status Worker::clear() {
  std::lock_guard lk(mu_);
  if (kvt_status s = bound("kvt_connector_clear_connector_metadata"); s != KVT_OK) return s;
  start_stores();  // what the engine never started still runs: no pin is left behind
  open_all_layers();
  meta_.reset();
  return KVT_OK;
}

void Worker::enqueue(Kind kind, std::vector<Batch> &batches) {
  if (batches.empty()) return;  // most steps: no need to wake the copy thread
  const bool async = kind == Kind::Load && meta_->async_load;
  for (const Batch &b : batches) {
    ++outstanding_[b.req_id];
    if (async) ++async_loads_[b.req_id];
    if (--unstarted_[b.req_id] == 0) unstarted_.erase(b.req_id);
  }
  queue_.push_back(Job{kind, meta_->step, binds_, std::move(batches), async});
  batches.clear();
  ++queued_;
  work_cv_.notify_one();
}

void Worker::start_loads() {
  if (loads_started_) return;
  loads_started_ = true;
  enqueue(Kind::LazyStore, meta_->lazy_stores);
  lazy_wait_ = load_wait_ = queued_;
  enqueue(Kind::Load, meta_->loads);
  if (!meta_->async_load) load_wait_ = queued_;
}

void Worker::start_stores() {
  start_loads();  // a store may read what a load of the same step writes
  if (stores_started_) return;
  stores_started_ = true;
  if (meta_->stores.empty()) return;
  enqueue(Kind::Store, meta_->stores);
  last_store_ = queued_;
}

void Worker::open_all_layers() {
  saved_.assign(saved_.size(), true);
  if (stores_waiting()) work_cv_.notify_one();
}

// Stores that may wait for a layer to be saved are queued or running. Most steps store
// nothing: waking the idle copy thread once per layer for them would cost more than a copy.
bool Worker::stores_waiting() const { return last_store_ > ended_; }

kvt_status Worker::start_load_kv() {
  std::unique_lock lk(mu_);
  if (kvt_status s = bound("kvt_connector_start_load_kv"); s != KVT_OK) return s;
  start_loads();
  // The model reuses lazily stored blocks in this step, and vLLM writes a layer's new KV
  // before that layer's wait_for_layer_load: they must have been stored before it starts.
  // Likewise earlier steps' stores, where the engine may have freed their blocks unseen.
  const uint64_t wait = stores_end_by_next_step_ ? std::max(lazy_wait_, prior_stores_)
                                                 : lazy_wait_;
  done_cv_.wait(lk, [&] { return ended_ >= wait; });
  return KVT_OK;
}

kvt_status Worker::wait_for_layer_load(uint32_t layer) {
  static constexpr const char *fn = "kvt_connector_wait_for_layer_load";
  std::unique_lock lk(mu_);
  if (kvt_status s = bound(fn); s != KVT_OK) return s;
  if (layer >= m_.geometry().num_layers)
    return fail(KVT_ERR_INVALID_ARGUMENT, "%s: layer %u is not below num_layers %u", fn, layer,
                m_.geometry().num_layers);
  if (!loads_started_) return fail(KVT_ERR_STATE, "%s: start_load_kv was not called", fn);
  // The step's synchronous loads are one job, published layer by layer as it runs.
  done_cv_.wait(lk, [&] {
    return ended_ >= load_wait_ || (ended_ + 1 == load_wait_ && running_layers_ > layer);
  });
  return KVT_OK;
}

kvt_status Worker::save_kv_layer(uint32_t layer) {
  static constexpr const char *fn = "kvt_connector_save_kv_layer";
  bool wake = false;
  {
    std::lock_guard lk(mu_);
    if (kvt_status s = bound(fn); s != KVT_OK) return s;
    if (layer >= m_.geometry().num_layers)
      return fail(KVT_ERR_INVALID_ARGUMENT, "%s: layer %u is not below num_layers %u", fn, layer,
                  m_.geometry().num_layers);
    start_stores();
    saved_[layer] = true;  // the forward wrote the layer: its stores may read it now
    wake = stores_waiting();
  }
  // Once per layer: unlocked, so that the copy thread does not wake only to wait for mu_.
  if (wake) work_cv_.notify_one();
  return KVT_OK;
}

kvt_status Worker::wait_for_save() {
  std::unique_lock lk(mu_);
  if (kvt_status s = bound("kvt_connector_wait_for_save"); s != KVT_OK) return s;
  start_stores();
  open_all_layers();  // layers whose save_kv_layer never came (vLLM skips some)
  // The step's loads have ended, even where the last layer's wait never came, so that the
  // next get_finished reports their failures within the step.
  done_cv_.wait(lk, [&] { return ended_ >= load_wait_; });
  return KVT_OK;
}

kvt_status Worker::handle_preemptions(const char *const *ids, size_t n) {
  std::vector<std::string> want(ids, ids + n);
  std::unique_lock lk(mu_);
  // A preempted request has no stores in the bound metadata (the engine did not schedule
  // it), but it may have lazy stores: those run before anything else of the step anyway.
  if (meta_) start_loads();
  // With a window, the engine may also write blocks it freed unannounced before this step's
  // start_load_kv (vLLM zeroes a Mamba hybrid's new blocks): earlier steps' stores end first.
  const uint64_t stores = !stores_end_by_next_step_ ? 0 : meta_ ? prior_stores_ : last_store_;
  done_cv_.wait(lk, [&] {
    return ended_ >= stores &&
           std::none_of(want.begin(), want.end(),
                        [&](const std::string &id) { return outstanding_.contains(id); });
  });
  return KVT_OK;
}

// Finished requests whose jobs all ended go to finished_sending.
void Worker::announce_finished() {
  for (auto it = finishing_.begin(); it != finishing_.end();) {
    auto cur = it++;
    if (outstanding_.contains(*cur) || unstarted_.contains(*cur)) continue;
    sending_.push_back(*cur);
    finishing_.erase(cur);
  }
}

kvt_status Worker::get_finished(kvt_finished *out) {
  // The outputs below live in the worker until the next call: two threads at once take turns.
  std::lock_guard out_lk(out_mu_);
  Report r;
  r.shape = shape_;
  r.rank = rank_;
  {
    std::unique_lock lk(mu_);
    // The step's synchronous loads have landed (the forward waited for every layer), but
    // their job may not have ended: a failed one must be reported in this step, before
    // anything computed over it is used (vLLM's get_block_ids_with_load_errors).
    if (meta_ && loads_started_) done_cv_.wait(lk, [&] { return ended_ >= load_wait_; });
    r.loads = std::move(loads_done_);
    r.stores = std::move(stores_done_);
    r.finished_sending = std::move(sending_);
    r.finished_recving = std::move(recving_);
    out_errors_ = std::move(load_errors_);
    loads_done_.clear();
    stores_done_.clear();
    sending_.clear();
    recving_.clear();
    load_errors_.clear();
  }
  report_ = encode(r);
  out_sending_ = std::move(r.finished_sending);
  out_recving_ = std::move(r.finished_recving);
  out_sending_ptrs_.clear();
  out_recving_ptrs_.clear();
  for (const std::string &s : out_sending_) out_sending_ptrs_.push_back(s.c_str());
  for (const std::string &s : out_recving_) out_recving_ptrs_.push_back(s.c_str());
  out->finished_sending = out_sending_ptrs_.data();
  out->num_finished_sending = out_sending_ptrs_.size();
  out->finished_recving = out_recving_ptrs_.data();
  out->num_finished_recving = out_recving_ptrs_.size();
  out->load_error_block_ids = out_errors_.data();
  out->num_load_errors = out_errors_.size();
  out->report = report_.data();
  out->report_len = report_.size();
  return KVT_OK;
}

void Worker::run() {
  std::unique_lock lk(mu_);
  for (;;) {
    work_cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, and everything queued has run
    Job job = std::move(queue_.front());
    queue_.pop_front();
    lk.unlock();
    std::vector<std::vector<Failure>> failed = execute(job);
    lk.lock();
    end(job, failed);
  }
}

// Reports the job's batches, and wakes whoever waits for them.
void Worker::end(const Job &job, std::vector<std::vector<Failure>> &failed) {
  for (size_t k = 0; k < job.batches.size(); ++k) {
    const Batch &b = job.batches[k];
    if (job.kind == Kind::Load) {
      for (const Failure &f : failed[k]) load_errors_.push_back(b.ops[f.op].g1);
      // Only the loads the engine waits for across steps: vLLM takes a request listed in
      // finished_recving for one in WAITING_FOR_REMOTE_KVS, or frees it when finished.
      if (job.async && --async_loads_[b.req_id] == 0) {
        async_loads_.erase(b.req_id);
        recving_.push_back(b.req_id);
      }
      loads_done_.push_back(Done{b.id, std::move(failed[k])});
    } else {
      stores_done_.push_back(Done{b.id, std::move(failed[k])});
    }
    if (--outstanding_[b.req_id] == 0) outstanding_.erase(b.req_id);
  }
  announce_finished();
  ++ended_;
  running_layers_ = 0;  // of the next job, which has copied nothing yet
  done_cv_.notify_all();
}

// The job's copies, each with its staging buffer when it goes through G3; a store of a
// request whose load failed in this step is cancelled: it was computed over missing bytes.
std::vector<Worker::Item> Worker::items(const Job &job, std::vector<AlignedBuffer> &staging) {
  const bool load = job.kind == Kind::Load;
  Tier *g2_tier = m_.tier_if_present(KVT_TIER_G2);
  const TierMemory *g2 = g2_tier ? &g2_tier->memory() : nullptr;  // present for G2 ops
  std::vector<Item> out;
  for (size_t b = 0; b < job.batches.size(); ++b) {
    const bool doomed = !load && failed_reqs_.contains(job.batches[b].req_id);
    for (const CopyOp &op : job.batches[b].ops) {
      Item it{&op, b, BlockRef{&g1_, op.g1, nullptr}, BlockRef{}};
      if (doomed) {
        it.status = KVT_ERR_CANCELLED;
      } else if (op.tier == KVT_TIER_G2) {
        it.other = BlockRef{g2, op.slot, nullptr};
      } else {
        staging.push_back(aligned_buffer(m_.geometry().block_bytes()));
        it.other = BlockRef{nullptr, 0, staging.back().get()};
      }
      out.push_back(it);
    }
  }
  return out;
}

// G3's part of a job, whole blocks: the reads of a load (each checked, before any of its
// bytes reach G1) or the writes of a store (once every layer is staged).
void Worker::run_disk(std::vector<Item> &its, bool write) {
  std::vector<DiskOp> disk;
  std::vector<Item *> of;
  for (Item &it : its) {
    if (it.status != KVT_OK || it.op->tier != KVT_TIER_G3) continue;
    disk.push_back({write, it.op->slot, it.other.buf, it.op->hash, it.op->parent});
    of.push_back(&it);
  }
  if (disk.empty()) return;
  m_.disk()->run(disk);
  for (size_t k = 0; k < disk.size(); ++k) of[k]->status = disk[k].status;
}

// Layers [first, end) of every copy still good, in one set (copy_set.hpp, as the
// pipeline's) so that the copy engine sees them whole. A copy that failed is left out of
// later layers: a failed load is recomputed whole.
void Worker::copy_layers(std::vector<Item> &its, uint32_t first, uint32_t end, bool load) {
  CopySet set(m_.geometry());
  for (size_t i = 0; i < its.size(); ++i)
    for (uint32_t l = first; its[i].status == KVT_OK && l < end; ++l)
      set.add_layer(load ? BlockCopy{its[i].g1, its[i].other} : BlockCopy{its[i].other, its[i].g1},
                    l, i);
  for (const CopySet::Failure &f : set.run(cuda_.get(), m_.pool())) its[f.owner].status = f.status;
}

// An eager store reads a layer only once the engine saved it (or gave up saving: wait_for_save,
// clear): before, the forward may still be writing it. Lazy stores read what earlier steps
// wrote. *end: past the layers from `layer` on that may be read now, which a store copies
// together, so that the copy engine starts and waits once for them rather than once per
// layer (on a GPU that is a launch and an event wait for every 1-2 MiB otherwise). A load
// takes one layer at a time: the engine waits for each. The nanoseconds it waited.
uint64_t Worker::wait_saved(const Job &job, uint32_t layer, uint32_t *end) {
  *end = layer + 1;
  if (job.kind != Kind::Store) return 0;
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_lock lk(mu_);
  work_cv_.wait(lk, [&] { return job.bind != binds_ || saved_[layer]; });
  const bool every = job.bind != binds_;
  while (*end < saved_.size() && (every || saved_[*end])) ++*end;
  return uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::steady_clock::now() - t0).count());
}

// wait_for_layer_load(L) returns once `layers` > L.
void Worker::publish_loaded(uint32_t layers) {
  {
    std::lock_guard lk(mu_);
    running_layers_ = layers;
  }
  done_cv_.notify_all();
}

// Runs one job layer-major: layer 0 of every copy, then layer 1, ...; per batch, the copies
// that failed and why.
std::vector<std::vector<Failure>> Worker::execute(const Job &job) {
  const auto t0 = std::chrono::steady_clock::now();
  const bool load = job.kind == Kind::Load;
  if (job.step != failed_step_) {
    failed_reqs_.clear();
    failed_step_ = job.step;
  }
  std::vector<AlignedBuffer> staging;
  std::vector<Item> its = items(job, staging);
  if (load) run_disk(its, false);
  uint64_t waited_ns = 0;
  for (uint32_t l = 0, end = 0; l < m_.geometry().num_layers; l = end) {
    waited_ns += wait_saved(job, l, &end);
    copy_layers(its, l, end, load);
    // The last layer is published by the job's end, with its report and load errors: the
    // engine takes them in get_finished after the forward, to recompute what failed.
    if (load && end < m_.geometry().num_layers) publish_loaded(end);
  }
  if (!load) run_disk(its, true);
  const uint64_t busy_ns = uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                        std::chrono::steady_clock::now() - t0).count()) -
                           waited_ns;
  std::vector<std::vector<Failure>> failed(job.batches.size());
  std::vector<std::vector<kvt_status>> status(job.batches.size());
  for (size_t b = 0; b < job.batches.size(); ++b) status[b].resize(job.batches[b].ops.size());
  for (const Item &it : its) {
    const auto i = uint32_t(it.op - job.batches[it.batch].ops.data());
    status[it.batch][i] = it.status;
    if (it.status == KVT_OK) continue;
    failed[it.batch].push_back(Failure{i, it.status});
    if (load) failed_reqs_.insert(job.batches[it.batch].req_id);
  }
  for (size_t b = 0; b < job.batches.size(); ++b)
    account(job.kind, job.batches[b], status[b],
            its.empty() ? 0 : busy_ns * status[b].size() / its.size());
  return failed;
}

// kvt_transfer_stats and the observe stream: the batch as one transfer per tier it touched,
// with the blocks that arrived and a share of its time by block count; a doomed batch
// counts as cancelled.
void Worker::account(Kind kind, const Batch &b, const std::vector<kvt_status> &status,
                     uint64_t busy_ns) {
  const bool load = kind == Kind::Load;
  const std::vector<CopyOp> &ops = b.ops;
  for (kvt_tier t : {KVT_TIER_G2, KVT_TIER_G3}) {
    uint64_t n = 0, ok = 0;
    kvt_status worst = KVT_OK;
    for (size_t i = 0; i < ops.size(); ++i) {
      if (ops[i].tier != t) continue;
      ++n;
      if (status[i] == KVT_OK) ++ok;
      else if (worst == KVT_OK || worst == KVT_ERR_CANCELLED) worst = status[i];
    }
    if (n == 0) continue;
    const Direction d = t == KVT_TIER_G2 ? (load ? Direction::G2toG1 : Direction::G1toG2)
                                         : (load ? Direction::G3toG1 : Direction::G1toG3);
    m_.pipeline().account(d, worst, ok, busy_ns * n / ops.size());
    if (m_.bus().on()) {
      ObsEvent e = obs_event(KVT_OBS_TRANSFER, b.req_id);
      e.src = load ? t : KVT_TIER_G1;
      e.dst = load ? KVT_TIER_G1 : t;
      e.status = worst;
      e.batch = b.id;
      e.blocks = ok;
      e.bytes = ok * m_.block_bytes();
      e.duration_ns = busy_ns;
      m_.bus().emit(e);
    }
  }
}

}  // namespace kvt::conn
