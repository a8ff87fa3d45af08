// The executor stage: commits a batch (the last point a cancel applies), upgrades its weak
// references, plans and runs every copy of the batch together (memory copies, then disk I/O,
// then G4's pipelined writes and reads, then the verified G3 and G4 reads into their blocks),
// registers offloaded copies and gives back its references. The only lock it holds while it
// works is each transfer's own, to commit and reserve that transfer's piece; never one that
// calls on other transfers need.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "pipeline/tiers.hpp"
#include "pipeline/transfer.hpp"

namespace kvt {

class CudaEngine;
class DiskEngine;
namespace remote {
class Store;
}
class WorkerPool;
struct BlockCopy;

class Executor {
 public:
  Executor(BlockTiers &tiers, DiskEngine *disk, CudaEngine *cuda, remote::Store *g4,
           WorkerPool &pool)
      : tiers_(tiers), disk_(disk), cuda_(cuda), g4_(g4), pool_(pool) {}

  // What one piece came to.
  struct Result {
    bool committed = false;                  // else its transfer ended before: skipped
    kvt_status status = KVT_OK;
    std::string message;
    size_t fail_item = SIZE_MAX;             // from G4: the first item that failed
    uint64_t count = 0;                      // offload: copies registered (G4: written)
    std::vector<Transfer::Landed> landed;    // onboard: copies written, still pinned
  };

  // Commits a batch and runs it: pieces whose transfers ended (cancelled) are skipped, the
  // others' transfers become INFLIGHT, and a cancel no longer applies to them. results[i]
  // is batch[i]'s. busy_ns gets each direction's share of the time spent copying.
  std::vector<Result> run(const std::vector<Piece> &batch, double busy_ns[kDirections]);

 private:
  struct Entry;
  struct Plan;
  // run's phases, in order, for each piece.
  void commit(Entry &e);
  void plan(Entry &e, Plan &p);
  void check_disk(Entry &e, Plan &p);
  void finish(Entry &e);
  void run_copies(const std::vector<BlockCopy> &copies, const std::vector<Entry *> &owner);
  // G4's phase: every write of the batch in one Store::put, every read in one Store::get.
  void run_g4(std::vector<Entry> &entries, std::vector<BlockCopy> &after,
              std::vector<Entry *> &after_owner, double busy_ns[kDirections]);

  BlockTiers &tiers_;
  DiskEngine *disk_;
  CudaEngine *cuda_;  // null unless G1 is in CUDA memory
  remote::Store *g4_;  // null without G4
  WorkerPool &pool_;
};

}  // namespace kvt
