// The offload pipeline: enqueue -> policy -> precondition -> batcher -> executor, each stage
// in its own file. One progress thread evaluates policies and polls CUDA-event fences;
// executor threads (max_concurrent_transfers) take batches, commit them and run the copies.
//
// No lock is held while a policy is evaluated or a batch is committed or copied: each
// transfer's state has its own small lock (Transfer::mu), and each stage's queue a short
// lock taken only to hand work over. So polling calls (kvt_xfer_wait with 0, status, cancel)
// never wait behind another transfer. A cancel before commitment ends the transfer at once
// and confirms it with XFER_DONE before it returns; a stage that still lists it drops it
// when it comes to it.
#pragma once

#include <absl/container/flat_hash_map.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/latency.hpp"
#include "kvtier.h"
#include "pipeline/batcher.hpp"
#include "pipeline/config.hpp"
#include "pipeline/executor.hpp"
#include "pipeline/policy.hpp"
#include "pipeline/precondition.hpp"
#include "pipeline/tiers.hpp"
#include "pipeline/transfer.hpp"

namespace kvt {

class Pipeline {
 public:
  // g4: G4's store, or null without G4.
  Pipeline(BlockTiers &tiers, const PipelineConfig &c, DiskEngine *disk, CudaEngine *cuda,
           remote::Store *g4, WorkerPool &pool);
  // Cancels what has not committed, waits for copies in flight.
  ~Pipeline();
  Pipeline(const Pipeline &) = delete;
  Pipeline &operator=(const Pipeline &) = delete;

  // Builds and checks a transfer; enqueue() starts it once the caller has named it (set
  // its token). dst is the host's raw tier number.
  kvt_status offload(std::shared_ptr<Transfer> *out, const kvt_block *src, size_t n, int dst,
                     uint64_t user_data);
  kvt_status onboard(std::shared_ptr<Transfer> *out, const kvt_block *src,
                     const kvt_block *dst, size_t n, uint64_t user_data);
  // From G4: the chain hashes[0..n) (parent first) into dst, Empty blocks of G1 or G2.
  kvt_status g4_onboard(std::shared_ptr<Transfer> *out, const uint64_t *hashes, size_t n,
                        uint64_t parent, const kvt_block *dst, uint64_t user_data);
  // f: the precondition, or null. Fails when f is not a live fence of this pipeline.
  kvt_status enqueue(const std::shared_ptr<Transfer> &t, const std::shared_ptr<Fence> &f);

  kvt_status cancel(Transfer &t);
  kvt_status wait(Transfer &t, int64_t timeout_ns);
  kvt_status status(uint32_t *state, kvt_status *result, uint64_t *count, Transfer &t);
  kvt_status blocks(kvt_block *out, size_t n, Transfer &t);
  void release(Transfer &t);
  // Counters of one direction; KVT_ERR_INVALID_ARGUMENT when src -> dst is not one.
  kvt_status transfer_stats(kvt_transfer_stats *out, int src, int dst);
  // Counts copies made outside the pipeline (a connector worker's batch) as one transfer of
  // direction d that ended with st, moved `blocks` and kept an engine busy for busy_ns.
  void account(Direction d, kvt_status st, uint64_t blocks, uint64_t busy_ns);
  // The durations of direction d's transfers (enqueue to end; a worker's: its batch).
  Latency latency(Direction d);

  kvt_status fence_create(std::shared_ptr<Fence> *out, void *cuda_event);
  kvt_status fence_signal(Fence &f);
  void fence_destroy(Fence &f);

  // kvt_manager_reset: ends every transfer not yet committed whose source or destination is
  // one of `tiers` (bit 1 << kvt_tier each) with KVT_ERR_CANCELLED, then waits until those
  // that had committed end too. Holds no lock while it waits. Transfers enqueued meanwhile
  // are not its concern.
  void drain(unsigned tiers);

  // Whether the pipeline holds block references it should not: with no batch in flight it
  // holds none. Waits up to a moment for batches in flight; says nothing if they go on.
  kvt_status check_refs();

 private:
  void progress_loop();
  void executor_loop();
  void evaluate(const std::shared_ptr<Transfer> &t);
  void precondition(const std::shared_ptr<Transfer> &t);
  void to_batcher(const std::shared_ptr<Transfer> &t);
  // Ends t with its last piece; a failure's log line goes to *failures.
  void piece_done(const Piece &p, Executor::Result &r, std::vector<std::string> *failures);
  // An onboard's destinations: Empty blocks of tier dst_tier (set), each listed once.
  kvt_status check_dst(Transfer &t, const char *fn, const kvt_block *dst, size_t n);
  // Ends t unless it has ended or (unless committed_ok) committed; true if this call did.
  bool end(Transfer &t, kvt_status st, std::string message, bool committed_ok = false);
  // The same, with t.mu held by the caller. Gives back its presence marks before it wakes
  // the waiters (lock order: Transfer::mu, then the policy stage's lock).
  bool end_locked(Transfer &t, kvt_status st, std::string message);

  BlockTiers &tiers_;
  remote::Store *g4_;
  PolicyStage policy_;
  PreconditionStage precondition_;
  Batcher batcher_;
  Executor executor_;
  const Clock::duration sweep_interval_;

  std::mutex intake_mu_;  // the policy stage's queue
  std::condition_variable intake_cv_;
  std::deque<std::shared_ptr<Transfer>> intake_;
  bool stopping_ = false;  // under intake_mu_

  std::mutex live_mu_;  // transfers not yet ended, for destruction
  absl::flat_hash_map<Transfer *, std::shared_ptr<Transfer>> live_;

  std::mutex stats_mu_;
  kvt_transfer_stats stats_[kDirections]{};
  Latency latency_[kDirections];  // of the transfers that ended, under stats_mu_

  // Held shared wherever the pipeline takes or gives back block references (an executor
  // from commitment to the end of its batch; blocks() and release() handing over pins), and
  // exclusively by check_refs. Taken before any Transfer::mu.
  std::shared_timed_mutex in_flight_;
  // Block references the pipeline holds between batches: pins on onboarded G1 blocks that
  // wait for the other pieces of their transfer, or for the host to read its final handles.
  std::atomic<uint64_t> parked_pins_{0};

  std::thread progress_;
  std::vector<std::thread> executors_;
};

}  // namespace kvt
