#include "manager/manager.hpp"

#include <mutex>

#include "common/error.hpp"
#include "manager/config.hpp"
#include "memory/cuda.hpp"

namespace kvt {

namespace {
kvt_status init_g1(TierMemory &mem, const kvt_manager_config &c, const Geometry &g) {
  if (const kvt_g1_layout *l = c.g1_layout) {
    if (l->memory == KVT_MEMORY_CUDA && !cuda::device_present(l->cuda_device))
      return fail(KVT_ERR_UNSUPPORTED,
                  "g1_layout is CUDA memory on device %d, but this kvtier %s", l->cuda_device,
                  cuda::device_present(0) ? "sees no such device" : "has no CUDA device");
    if (l->memory == KVT_MEMORY_CUDA)
      if (kvt_status s = TierMemory::check_on_device(g, *l, c.g1_blocks, "g1_layout"); s != KVT_OK)
        return s;
    mem.init_engine(g, *l);
    return KVT_OK;
  }
  bool device = cuda::device_present(c.cuda_device);
  if (c.g1_memory == KVT_MEMORY_CUDA && !device)
    return fail(KVT_ERR_UNSUPPORTED,
                "g1_memory is KVT_MEMORY_CUDA but CUDA device %d is not available to kvtier",
                c.cuda_device);
  if (c.g1_memory == KVT_MEMORY_HOST || !device) return mem.init_host(c.g1_blocks, g, false);
  return mem.init_cuda(c.g1_blocks, g, c.cuda_device);
}
}  // namespace

kvt_status Manager::create(std::unique_ptr<Manager> *out, const kvt_manager_config &c) {
  if (kvt_status s = config_validate(c); s != KVT_OK) return s;
  std::unique_ptr<Manager> m(new Manager());
  m->geo_ = Geometry{c.num_layers, c.num_outer, c.chunk_bytes};
  m->cfg_ = c;
  m->cfg_.g3_path = nullptr;
  m->cfg_.g1_layout = nullptr;
  m->cfg_.kv_events_endpoint = m->cfg_.kv_events_replay_endpoint = nullptr;
  m->cfg_.kv_events_topic = nullptr;
  m->cfg_.g4_url = m->cfg_.g4_password_env = m->cfg_.g4_key_prefix = nullptr;
  m->cfg_.g4_key_env = nullptr;
  if (kvt_status s = m->tag_.acquire(); s != KVT_OK) return s;
  m->events_ = std::make_unique<EventQueue>(c.event_capacity);
  const uint64_t caps[4] = {0, c.g1_blocks, c.g2_blocks, c.g3_blocks};
  for (int t = KVT_TIER_G1; t <= KVT_TIER_G3; ++t) {
    if (caps[t] == 0) continue;
    auto tier = std::make_unique<Tier>(
        kvt_tier(t), m->tag_.value(), caps[t], c.page_size, 0,
        EvictionConfig{kvt_eviction(c.eviction[t - 1]), c.max_pinned_percent});
    tier->set_events(m->events_.get());
    tier->set_obs(m->bus_.get());
    kvt_status s = KVT_OK;
    if (t == KVT_TIER_G1) {
      s = init_g1(tier->memory(), c, m->geo_);
    } else if (t == KVT_TIER_G2) {
      // Pinned when a GPU will copy to and from it.
      s = tier->memory().init_host(caps[t], m->geo_, cuda::device_present(c.cuda_device));
    }
    if (s != KVT_OK) return s;
    m->tiers_[t] = std::move(tier);
  }
  if (kvt_status s = m->start_publisher(c); s != KVT_OK) return s;
  m->pool_ = std::make_unique<WorkerPool>(c.copy_threads - 1);
  std::vector<Tier::Recovered> recovered;
  if (c.g3_blocks > 0) {
    kvt_status s = DiskEngine::create(&m->disk_, disk_config(c), m->geo_.block_bytes());
    if (s != KVT_OK) return s;
    std::vector<Tier::Recovered> kept = m->disk_->take_recovered();  // persistent G3
    recovered.reserve(kept.size());
    m->tiers_[KVT_TIER_G3]->recover(kept.data(), kept.size(), &recovered);
  }
  m->announce_start(recovered);
  if (m->tiers_[KVT_TIER_G1]->memory().kind() == KVT_MEMORY_CUDA) {
    int device = c.g1_layout ? c.g1_layout->cuda_device : c.cuda_device;
    if (kvt_status s = CudaEngine::create(&m->cuda_, device, kvt_cuda_copy(c.cuda_copy),
                                          c.chunk_bytes);
        s != KVT_OK)
      return s;
    if (m->tiers_[KVT_TIER_G2]) {
      const TierMemory &g2 = m->tiers_[KVT_TIER_G2]->memory();
      m->cuda_->map_host(g2.pinned_base(), g2.bytes());
    }
  }
  if (c.g4_url != nullptr) {  // connects at its first use, so Redis may come later
    remote::Config rc;
    if (kvt_status s = g4_config(&rc, c); s != KVT_OK) return s;
    if (kvt_status s = remote::Store::create(&m->g4_, rc); s != KVT_OK) return s;
  }
  m->pipeline_ =
      std::make_unique<Pipeline>(m->pipeline_tiers_, pipeline_config(c), m->disk_.get(),
                                 m->cuda_.get(), m->g4_.get(), *m->pool_);
  *out = std::move(m);
  return KVT_OK;
}

kvt_status Manager::start_publisher(const kvt_manager_config &c) {
  if (c.kv_events_endpoint == nullptr) return KVT_OK;
  pub::PublisherConfig p{};
  p.endpoint = c.kv_events_endpoint;
  if (c.kv_events_replay_endpoint) p.replay_endpoint = c.kv_events_replay_endpoint;
  if (c.kv_events_topic) p.topic = c.kv_events_topic;
  p.buffer = c.kv_events_buffer;
  p.dp_rank = c.kv_events_dp_rank;
  p.page_size = c.page_size;
  p.format = kvt_kv_events_format(c.kv_events_format);
  const uint64_t caps[4] = {0, c.g1_blocks, c.g2_blocks, c.g3_blocks};
  for (int t = KVT_TIER_G1; t <= KVT_TIER_G3; ++t) {
    if (!tiers_[t]) continue;
    p.memo_blocks += caps[t];
    if (c.kv_events_tiers & (1u << t)) p.tiers |= 1u << t;
  }
  if (kvt_status s = pub::Publisher::create(&publisher_, p); s != KVT_OK) return s;
  // Every tier notes its tokens, published or not: a block may be published in another.
  for (auto &t : tiers_)
    if (t) t->set_kv_sink(publisher_.get());
  const unsigned published = p.tiers;
  publisher_->set_snapshot_source([this, published](std::vector<pub::QueuedEvent> *out) {
    std::vector<uint64_t> parents;
    for (int t = KVT_TIER_G1; t <= KVT_TIER_G3; ++t) {
      if (!(published & (1u << t))) continue;
      const std::vector<uint64_t> hashes = tiers_[t]->hashes(&parents);
      for (size_t i = 0; i < hashes.size(); ++i)
        out->push_back(pub::QueuedEvent{hashes[i], parents[i], uint8_t(KVT_EVENT_BLOCK_STORED),
                                        uint8_t(t), false});
      parents.clear();
    }
  });
  return KVT_OK;
}

// The publisher outlives the tiers (they send to it): its snapshots stop reading them first.
Manager::~Manager() {
  if (publisher_) publisher_->set_snapshot_source(nullptr);
}

// A publisher that starts tells its subscribers so, before anything else: every tier
// cleared (AllBlocksCleared: a router drops what it held for this instance, from before a
// restart), then a BlockStored for each block a persistent G3 recovered (docs/KV_EVENTS.md).
void Manager::announce_start(const std::vector<Tier::Recovered> &recovered) {
  if (!publisher_) return;
  std::vector<kvt_event> start;
  start.reserve(KVT_TIER_G3 + recovered.size());
  for (int t = KVT_TIER_G1; t <= KVT_TIER_G3; ++t) {
    if (!tiers_[t]) continue;
    kvt_event e{};
    e.type = KVT_EVENT_TIER_CLEARED;
    e.tier = uint32_t(t);
    start.push_back(e);
  }
  for (const Tier::Recovered &r : recovered) {
    kvt_event e{};
    e.type = KVT_EVENT_BLOCK_STORED;
    e.tier = KVT_TIER_G3;
    e.hash = r.seq_hash;
    e.parent_hash = r.parent;
    start.push_back(e);
  }
  publisher_->publish(start.data(), start.size());
}

Tier *Manager::tier(int t) noexcept {
  if (t == KVT_TIER_G4) {
    fail(KVT_ERR_INVALID_ARGUMENT,
         "tier G4 (4) holds no blocks of its own: use kvt_xfer_offload to G4, kvt_g4_match and "
         "kvt_g4_onboard");
    return nullptr;
  }
  if (t < KVT_TIER_G1 || t > KVT_TIER_G3) {
    fail(KVT_ERR_INVALID_ARGUMENT, "tier %d is not a tier: KVT_TIER_G1 (1), G2 (2) or G3 (3)", t);
    return nullptr;
  }
  if (!tiers_[t]) {
    fail(KVT_ERR_INVALID_ARGUMENT, "tier G%d is absent: its capacity is 0 in the config", t);
    return nullptr;
  }
  return tiers_[t].get();
}

Tier *Manager::tier_of(kvt_block b) noexcept {
  if (b == 0) {
    fail(KVT_ERR_INVALID_HANDLE, "block handle 0 is never valid");
    return nullptr;
  }
  unsigned t = handle::tier(b);
  if (handle::tag(b) != tag_.value() || t < KVT_TIER_G1 || !tiers_[t]) {
    fail(KVT_ERR_INVALID_HANDLE, "block handle 0x%llx belongs to no block of this manager",
         (unsigned long long)b);
    return nullptr;
  }
  return tiers_[t].get();
}

kvt_status Manager::release(const kvt_block *blocks, size_t n, Holder h) {
  // Take every involved tier's lock, in tier order, so that the call is all or nothing.
  unsigned mask = 0;
  for (size_t i = 0; i < n; ++i) {
    Tier *t = tier_of(blocks[i]);
    if (t == nullptr) return KVT_ERR_INVALID_HANDLE;
    mask |= 1u << t->id();
  }
  std::unique_lock<std::mutex> locks[4];
  for (int t = KVT_TIER_G1; t <= KVT_TIER_G3; ++t)
    if (mask & (1u << t)) locks[t] = std::unique_lock(tiers_[t]->lock());

  for (size_t i = 0; i < n; ++i) {
    kvt_status s = tiers_[handle::tier(blocks[i])]->take_ref_locked(blocks[i], h);
    if (s != KVT_OK) {
      while (i-- > 0) tiers_[handle::tier(blocks[i])]->undo_take_ref_locked(blocks[i], h);
      return s;
    }
  }
  // Backwards: the later a block stands in the call, the sooner it is evicted.
  for (size_t i = n; i-- > 0;) tiers_[handle::tier(blocks[i])]->settle_locked(blocks[i]);
  return KVT_OK;
}

kvt_status Manager::reset(int tier) {
  unsigned mask = 0;
  if (tier != 0) {
    if (this->tier(tier) == nullptr) return KVT_ERR_INVALID_ARGUMENT;
    mask = 1u << tier;
  } else {
    for (int t = KVT_TIER_G1; t <= KVT_TIER_G3; ++t)
      if (tiers_[t]) mask |= 1u << t;
  }
  // First the transfers, so that no copy registers into a tier after it was emptied.
  pipeline_->drain(mask);
  for (int t = KVT_TIER_G1; t <= KVT_TIER_G3; ++t)
    if (mask & (1u << t)) tiers_[t]->clear();
  if ((mask & (1u << KVT_TIER_G3)) && disk_) disk_->forget_all();  // a persistent G3's file
  return KVT_OK;
}

kvt_status Manager::check() {
  for (auto &t : tiers_)
    if (t)
      if (kvt_status s = t->check(); s != KVT_OK) return s;
  return pipeline_->check_refs();
}

}  // namespace kvt
