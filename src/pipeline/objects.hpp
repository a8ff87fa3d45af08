// The structs behind kvt_xfer and kvt_fence. Every field after `pipe` is guarded by the
// pipeline's mutex. Both are owned by the pipeline, which frees them once neither the host
// nor a stage refers to them.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "kvtier.h"

namespace kvt {
class Pipeline;

struct SourceRef {
  kvt_block handle;  // weak until commit
  uint64_t hash, parent;
};
}  // namespace kvt

struct kvt_fence {
  static constexpr uint64_t kMagic = 0x6b767466656e6365;  // "kvtfence"
  uint64_t magic = kMagic;
  kvt::Pipeline *pipe;
  void *cuda_event = nullptr;        // polled by the progress thread when set
  bool signalled = false;
  bool host_holds = true;            // until kvt_fence_destroy
  std::vector<kvt_xfer *> waiters;   // transfers in KVT_XFER_WAITING on this fence
  unsigned users = 0;                // transfers that will reach the precondition stage
};

struct kvt_xfer {
  static constexpr uint64_t kMagic = 0x6b76747866657221;  // "kvtxfer!"
  uint64_t magic = kMagic;
  kvt::Pipeline *pipe;
  bool onboard = false;
  kvt_tier src_tier{}, dst_tier{};
  uint64_t user_data = 0;
  std::vector<kvt::SourceRef> src;
  std::vector<kvt_block> dst_g1;     // onboard: the caller's blocks, pairwise with src
  kvt_fence *fence = nullptr;        // until the precondition is met
  std::chrono::steady_clock::time_point batched_at;

  kvt_xfer_state state = KVT_XFER_QUEUED;
  kvt_status result = KVT_AGAIN;
  uint64_t count = 0;
  std::string message;               // why it failed
  std::vector<uint64_t> reserved;    // hashes this transfer holds in the in-flight set
  std::vector<kvt_block> final_blocks;  // onboard: the G1 handles to use afterwards
  bool host_holds = true;            // until kvt_xfer_release
  bool ended() const {
    return state == KVT_XFER_DONE || state == KVT_XFER_CANCELLED || state == KVT_XFER_FAILED;
  }
};
