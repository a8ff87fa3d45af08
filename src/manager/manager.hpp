// The manager: validated configuration, the tiers and the event queue.
#pragma once

#include <atomic>
#include <memory>

#include "block/tag_pool.hpp"
#include "block/tier.hpp"
#include "event/event_queue.hpp"
#include "kvtier.h"
#include "memory/tier_memory.hpp"
#include "observe/bus.hpp"
#include "manager/pipeline_tiers.hpp"
#include "pipeline/pipeline.hpp"
#include "kv_events/publisher.hpp"
#include "remote/store.hpp"
#include "copy/cuda_engine.hpp"
#include "copy/disk_engine.hpp"
#include "copy/worker_pool.hpp"

namespace kvt {

class Manager {
 public:
  // Validates cfg; on failure returns the status with the message set and *out untouched.
  static kvt_status create(std::unique_ptr<Manager> *out, const kvt_manager_config &cfg);
  ~Manager();

  // The tier a handle names, or nullptr with KVT_ERR_INVALID_HANDLE set.
  Tier *tier_of(kvt_block b) noexcept;
  // The tier by number, or nullptr with an error set (unknown or absent tier).
  Tier *tier(int t) noexcept;
  // The tier by number, or nullptr when absent or not 1..3 (G4 has no blocks); sets no error.
  Tier *tier_if_present(int t) noexcept {
    return t >= KVT_TIER_G1 && t <= KVT_TIER_G3 ? tiers_[t].get() : nullptr;
  }
  // G4's store, or nullptr without G4 (g4_url NULL).
  remote::Store *g4() noexcept { return g4_.get(); }

  kvt_status release(const kvt_block *blocks, size_t n, Holder h = Holder::Host);
  kvt_status check();
  // kvt_manager_reset: tier 1..3, or 0 for every tier present.
  kvt_status reset(int tier);
  EventQueue &events() noexcept { return *events_; }
  // The observe bus; shared with the subscriptions, which may outlive the manager.
  obs::Bus &bus() noexcept { return *bus_; }
  const std::shared_ptr<obs::Bus> &bus_ptr() noexcept { return bus_; }
  Pipeline &pipeline() noexcept { return *pipeline_; }
  uint64_t block_bytes() const noexcept { return geo_.block_bytes(); }
  // The validated config; its pointers (g3_path, g1_layout, the strings) are cleared.
  const kvt_manager_config &config() const noexcept { return cfg_; }
  WorkerPool &pool() noexcept { return *pool_; }
  DiskEngine *disk() noexcept { return disk_.get(); }
  // A manager serves at most one connector: true for the caller that takes it.
  bool take_connector() noexcept { return !has_connector_.exchange(true); }
  void give_connector() noexcept { has_connector_ = false; }
  const Geometry &geometry() const noexcept { return geo_; }
  // The KV-event publisher (kvt_manager_note_tokens, the connector), or nullptr when off.
  KvSink *kv_sink() noexcept { return publisher_.get(); }

 private:
  Manager() = default;
  kvt_status start_publisher(const kvt_manager_config &c);
  void announce_start(const std::vector<Tier::Recovered> &recovered);

  Geometry geo_{};
  kvt_manager_config cfg_{};
  std::atomic<bool> has_connector_{false};
  TagLease tag_;  // before the tiers: given back only once they are gone
  std::unique_ptr<EventQueue> events_;
  std::shared_ptr<obs::Bus> bus_ = std::make_shared<obs::Bus>();  // before all that emit
  std::unique_ptr<pub::Publisher> publisher_;  // before the tiers, which send to it
  std::unique_ptr<Tier> tiers_[4];  // index by kvt_tier; null when the tier is absent
  std::unique_ptr<WorkerPool> pool_;
  std::unique_ptr<DiskEngine> disk_;   // G3's file, when G3 is present
  std::unique_ptr<CudaEngine> cuda_;   // when G1 is in CUDA memory
  std::unique_ptr<remote::Store> g4_;  // when g4_url is set
  PipelineTiers pipeline_tiers_{*this};
  std::unique_ptr<Pipeline> pipeline_;  // last: stopped first, while the rest still stands
};

}  // namespace kvt
