// The connector's worker half: copies between the engine's G1 blocks and its manager's G2
// memory and G3 file, at the slots each step's metadata names, on one copy thread, and
// reports what ended. It never touches the manager's registries. A step's copies move layer
// by layer, so that they overlap the engine's forward: its loads layer-major, each layer
// published as it lands; its stores each layer once the engine saved it.
#pragma once

#include <absl/container/flat_hash_map.h>
#include <absl/container/flat_hash_set.h>

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "connector/metadata.hpp"
#include "kvtier.h"
#include "memory/mapping.hpp"
#include "memory/tier_memory.hpp"
#include "copy/memcpy_engine.hpp"

namespace kvt {
class Manager;
class CudaEngine;
}  // namespace kvt

namespace kvt::conn {

class Worker {
 public:
  // rank: this worker's, of world_size workers of one scheduler half. stores_end_by_next_step:
  // start_load_kv also waits for the stores of earlier steps to end (an engine that frees
  // blocks without telling the connector rewrites them in the next forward).
  Worker(Manager &m, uint32_t world_size, uint32_t rank, bool stores_end_by_next_step);
  ~Worker();  // runs what is queued, then stops
  Worker(const Worker &) = delete;
  Worker &operator=(const Worker &) = delete;

  kvt_status register_kv_caches(const kvt_g1_layout &layout, uint64_t num_blocks);
  kvt_status bind(const void *bytes, size_t len);
  kvt_status clear();
  kvt_status start_load_kv();
  kvt_status wait_for_layer_load(uint32_t layer);
  kvt_status save_kv_layer(uint32_t layer);
  kvt_status wait_for_save();
  kvt_status handle_preemptions(const char *const *ids, size_t n);
  kvt_status get_finished(kvt_finished *out);

 private:
  enum class Kind : uint8_t { LazyStore, Load, Store };
  // All the batches of one kind of one step, copied layer by layer.
  struct Job {
    Kind kind;
    uint64_t step;
    uint64_t bind;  // the bind it came from: its store's layers open with that bind's saves
    std::vector<Batch> batches;
    bool async = false;  // loads the engine waits for in finished_recving
  };
  // One copy of a job: the G1 block, the other side (a G2 slot or a G3 staging buffer).
  struct Item {
    const CopyOp *op;
    size_t batch;
    BlockRef g1, other;
    kvt_status status = KVT_OK;
  };
  kvt_status bound(const char *fn) const;
  void start_loads();   // under mu_
  void start_stores();  // under mu_
  void open_all_layers();  // under mu_: every layer of the bound step's stores may be read
  bool stores_waiting() const;  // under mu_
  void enqueue(Kind kind, std::vector<Batch> &batches);  // under mu_
  void announce_finished();                              // under mu_
  void run();
  void end(const Job &job, std::vector<std::vector<Failure>> &failed);  // under mu_
  std::vector<std::vector<Failure>> execute(const Job &job);
  std::vector<Item> items(const Job &job, std::vector<AlignedBuffer> &staging);
  void run_disk(std::vector<Item> &items, bool write);
  void copy_layers(std::vector<Item> &items, uint32_t first, uint32_t end, bool load);
  uint64_t wait_saved(const Job &job, uint32_t layer, uint32_t *end);
  void publish_loaded(uint32_t layers);
  void account(Kind kind, const Batch &b, const std::vector<kvt_status> &status, uint64_t busy_ns);

  Manager &m_;
  Shape shape_;
  uint32_t rank_;
  const bool stores_end_by_next_step_;
  TierMemory g1_;
  uint64_t g1_blocks_ = 0;
  std::unique_ptr<CudaEngine> cuda_;
  // Requests with a load that failed in step failed_step_: the step computed their blocks
  // over bytes that never came, so their stores of that step fail too. Copy thread only.
  absl::flat_hash_set<std::string> failed_reqs_;
  uint64_t failed_step_ = 0;

  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  std::deque<Job> queue_;
  uint64_t queued_ = 0, ended_ = 0;  // jobs run in order: job k has ended when ended_ >= k
  uint32_t running_layers_ = 0;      // layers of job ended_ + 1 copied so far
  uint64_t binds_ = 0;               // binds so far
  std::vector<bool> saved_;          // layers of the bound step's stores that may be read
  uint64_t last_store_ = 0;          // the job of the most recent eager stores
  bool stop_ = false;
  // Queued or running batches per request.
  absl::flat_hash_map<std::string, uint32_t> outstanding_;
  absl::flat_hash_map<std::string, uint32_t> async_loads_;  // of those, asynchronous loads
  absl::flat_hash_map<std::string, uint32_t> unstarted_;    // the bound metadata's other batches
  absl::flat_hash_set<std::string> finishing_;  // finished requests with jobs outstanding
  std::vector<Done> loads_done_, stores_done_;
  std::vector<std::string> sending_, recving_;
  std::vector<uint32_t> load_errors_;

  // The bound metadata and how far its step got.
  std::optional<Meta> meta_;
  bool loads_started_ = false, stores_started_ = false;
  uint64_t lazy_wait_ = 0;  // the job start_load_kv waits for: the step's last lazy store
  uint64_t load_wait_ = 0;  // the job wait_for_layer_load waits for
  uint64_t prior_stores_ = 0;  // the job of the stores of earlier steps, at bind

  // What the last get_finished handed out, under out_mu_ (not mu_: the copy thread's).
  std::mutex out_mu_;
  std::string report_;
  std::vector<std::string> out_sending_, out_recving_;
  std::vector<const char *> out_sending_ptrs_, out_recving_ptrs_;
  std::vector<uint32_t> out_errors_;

  std::thread thread_;  // last: started once everything above exists
};

}  // namespace kvt::conn
