// The offload pipeline of DESIGN section 6 (seed 001):
//   enqueue -> PolicyEvaluator -> PreconditionAwaiter -> Batcher -> TransferExecutor.
// One progress thread evaluates policies and polls CUDA-event fences; executor threads
// (max_concurrent_transfers) form batches, commit them and run the copies. Every stage
// before commitment is a list under one mutex, so a cancel removes its container at once
// (P1, P2, P6) and confirms it with XFER_DONE before it returns.
#pragma once

#include <absl/container/flat_hash_map.h>
#include <absl/container/flat_hash_set.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kvtier.h"
#include "pipeline/objects.hpp"

namespace kvt {

class Manager;
class CudaEngine;
class DiskEngine;
class WorkerPool;
struct BlockCopy;

class Pipeline {
 public:
  Pipeline(Manager &m, const kvt_manager_config &c, DiskEngine *disk, CudaEngine *cuda,
           WorkerPool &pool);
  // Cancels what has not committed, waits for copies in flight, frees every transfer and
  // fence.
  ~Pipeline();
  Pipeline(const Pipeline &) = delete;
  Pipeline &operator=(const Pipeline &) = delete;

  // dst is the host's raw tier number, checked here before it becomes a kvt_tier.
  kvt_status offload(kvt_xfer **out, const kvt_block *src, size_t n, int dst,
                     kvt_fence *f, uint64_t user_data);
  kvt_status onboard(kvt_xfer **out, const kvt_block *src, const kvt_block *dst_g1, size_t n,
                     kvt_fence *f, uint64_t user_data);
  kvt_status cancel(kvt_xfer *x);
  kvt_status wait(kvt_xfer *x, int64_t timeout_ns);
  kvt_status status(uint32_t *state, kvt_status *result, uint64_t *count, kvt_xfer *x);
  kvt_status blocks(kvt_block *out, size_t n, kvt_xfer *x);
  void release(kvt_xfer *x);
  // Counters of one direction; KVT_ERR_INVALID_ARGUMENT when src -> dst is not one.
  kvt_status transfer_stats(kvt_transfer_stats *out, int src, int dst);

  kvt_status fence_create(kvt_fence **out, void *cuda_event);
  kvt_status fence_signal(kvt_fence *f);
  void fence_destroy(kvt_fence *f);

 private:
  using Clock = std::chrono::steady_clock;
  struct Entry;   // one committed container
  struct Batch;   // what one executor runs

  kvt_status enqueue(kvt_xfer **out, std::unique_ptr<kvt_xfer> x, kvt_fence *f);
  void progress_loop();
  void executor_loop();
  void evaluate_locked(kvt_xfer *x);
  void precondition_locked(kvt_xfer *x);
  void signal_locked(kvt_fence *f);
  bool flush_ready_locked(Clock::time_point now, Clock::time_point *deadline) const;
  Batch commit_locked();
  void execute(Batch &b);  // runs without the lock
  void run_copies(const std::vector<BlockCopy> &copies, const std::vector<Entry *> &owner);
  void end_locked(kvt_xfer *x, kvt_status st, std::string message);
  void unreserve_locked(kvt_tier dst, uint64_t hash);
  void leave_fence_locked(kvt_xfer *x);
  void maybe_free_fence_locked(kvt_fence *f);
  const kvt_policy &policy(kvt_tier src, kvt_tier dst) const;
  // 0..4 for G1->G2, G1->G3, G2->G3, G2->G1, G3->G1; -1 for anything else.
  static int direction(int src, int dst) noexcept;
  // Shares a batch phase's duration among the directions of the blocks it moved.
  static void charge(Batch &b, Clock::duration t, const std::vector<Entry *> &owners);

  Manager &m_;
  DiskEngine *disk_;
  CudaEngine *cuda_;  // null unless G1 is in CUDA memory
  WorkerPool &pool_;
  const uint32_t max_batch_, min_batch_;
  const Clock::duration flush_interval_, policy_timeout_, sweep_interval_;
  const kvt_policy policies_[3];  // G1->G2, G1->G3, G2->G3

  std::mutex mu_;
  std::condition_variable progress_cv_, exec_cv_, done_cv_;
  std::deque<kvt_xfer *> intake_;    // QUEUED offloads, for the policy stage
  std::deque<kvt_xfer *> batching_;  // BATCHED, oldest first
  size_t batching_blocks_ = 0;
  absl::flat_hash_map<uint64_t, uint32_t> inflight_[4];  // per destination tier: presence
  absl::flat_hash_map<uint64_t, uint32_t> offered_[3];   // per tier pair: frequency
  absl::flat_hash_map<kvt_xfer *, std::unique_ptr<kvt_xfer>> xfers_;
  absl::flat_hash_map<kvt_fence *, std::unique_ptr<kvt_fence>> fences_;
  size_t cuda_fences_waiting_ = 0;
  kvt_transfer_stats stats_[5]{};
  bool stopping_ = false;
  std::thread progress_;
  std::vector<std::thread> executors_;
};

}  // namespace kvt
