// The pipeline's state of one transfer and of one fence. The host reaches them only through
// tokens (src/abi/xfer_table.hpp) and shared ownership, so a waiter, a stage and the host
// each keep what they use alive, and nothing is freed under anyone.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "kvtier.h"
#include "common/direction.hpp"

namespace kvt {

class Pipeline;
struct Transfer;
using Clock = std::chrono::steady_clock;

struct SourceRef {
  kvt_block handle;  // weak until commit; 0 for a G4 source (a key, not a block)
  uint64_t hash, parent;
};

struct Fence {
  Pipeline *pipe = nullptr;
  void *cuda_event = nullptr;  // polled by the progress thread when set
  // Under the precondition stage's lock:
  bool signalled = false;
  bool host_holds = true;  // until kvt_fence_destroy
  // Parked in KVT_XFER_WAITING. Weak: a transfer refers to its fence, and the pipeline
  // keeps every transfer alive until it ends.
  std::vector<std::weak_ptr<Transfer>> waiters;
};

struct Transfer {
  // Set before the transfer is enqueued, read-only afterwards.
  Pipeline *pipe = nullptr;
  uint64_t token = 0;  // what the host and the events call it
  bool onboard = false;
  std::optional<Direction> dir;  // none for an empty container
  kvt_tier src_tier{}, dst_tier{};
  uint64_t user_data = 0;
  Clock::time_point created = Clock::now();  // for the observe TRANSFER event
  // Onboard: the caller's Empty blocks, pairwise with src, all in dst_tier (G1; from G4,
  // G1 or G2).
  std::vector<kvt_block> dst;
  std::shared_ptr<Fence> fence;   // the precondition, or null

  // The container. Written only by the stage that holds the transfer (policy evaluation
  // filters it), read-only once it reaches the batcher.
  std::vector<SourceRef> src;

  // Everything below is guarded by mu. Stages take it only to read or change the state;
  // no stage holds it while it evaluates or copies, except to register an onboard's blocks
  // at its end (so that a release either comes before, or finds the transfer ended).
  std::mutex mu;
  std::condition_variable ended_cv;
  kvt_xfer_state state = KVT_XFER_QUEUED;
  kvt_status result = KVT_AGAIN;
  uint64_t count = 0;
  std::string message;               // why it failed
  bool host_holds = true;            // until kvt_xfer_release
  std::vector<uint64_t> reserved;    // hashes this transfer holds in the in-flight set
  // Pieces: a container larger than a batch is split; it ends when its last piece does.
  size_t pieces_left = 0;
  kvt_status piece_status = KVT_OK;  // the first failure among the pieces
  std::string piece_message;
  // From G4: the first item (in chain order) that could not be had. Its failure is the
  // transfer's, and the items before it are registered.
  size_t fail_item = SIZE_MAX;
  struct Landed {
    size_t item;    // index into src and dst
    kvt_block g1;   // dst[item] (G1, or G2 from G4), pinned, holding the copied bytes
  };
  std::vector<Landed> landed;           // onboard: registered when the last piece ends
  std::vector<kvt_block> final_blocks;  // onboard: the G1 handles to use afterwards
  // Onboard items whose final block is another, pinned by the pipeline until the host reads
  // the final handles (then it takes the pin, and its own block goes) or releases the
  // transfer (then the pin goes, and its own block stays).
  std::vector<size_t> unread_dedups;

  bool ended() const {
    return state == KVT_XFER_DONE || state == KVT_XFER_CANCELLED || state == KVT_XFER_FAILED;
  }
};

// What the batcher hands the executor: src[begin, end) of one transfer.
struct Piece {
  std::shared_ptr<Transfer> t;
  size_t begin, end;
  Clock::time_point batched_at;
};

}  // namespace kvt
