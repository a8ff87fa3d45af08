// G3: one preallocated file per manager (copy/g3_file.hpp). Slot s lives at
// s * slot_bytes and holds the block's data, padded to 4 KiB, then a 4 KiB header with the
// sequence hash and an xxh3 checksum of the data, so that a torn or corrupt slot is caught
// on every read; with g3_key_env, a keyed MAC instead of the data's checksum, so that a
// writer without the key cannot make a slot that is read as a block. I/O is O_DIRECT where
// the filesystem allows it, through io_uring or, where io_uring is unavailable or not
// wanted, I/O threads (copy/disk_io.hpp).
// A persistent G3 (g3_persist) adds a file header and a slot table before the slots
// (copy/g3_table.hpp, docs/G3_FORMAT.md): each write clears its slot's record before it
// is issued and sets it once it has completed.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "block/tier.hpp"
#include "common/keyed_mac.hpp"
#include "kvtier.h"

namespace kvt {

class G3File;
class G3Table;
class RingPool;
class IoThreads;

// G3's settings, translated from kvt_manager_config by the manager, which validated them.
struct DiskConfig {
  const char *dir = nullptr;       // g3_path; NULL: a fresh temporary directory
  uint64_t blocks = 0;             // slots
  // What a persistent file's header must match, with the slot size.
  uint32_t page_size = 0, num_layers = 0, num_outer = 0;
  uint64_t chunk_bytes = 0, ns = 0;
  bool persist = false;
  uint32_t on_mismatch = 0;        // kvt_g3_mismatch
  const char *key_env = nullptr;   // g3_key_env: the variable holding the slots' MAC key
  uint32_t io = KVT_IO_AUTO;       // kvt_io_engine
  uint32_t rings = 1;              // io_uring rings: batches that may run at once
  uint32_t io_threads = 0;         // without io_uring, besides the caller's
  uint32_t fault_op = KVT_G3_FAULT_OFF;  // kvt_g3_fault, and the other g3_fault_* fields
  int32_t fault_errno = 0;
  uint64_t fault_skip = 0, fault_count = 0;
};

struct DiskOp {
  bool write;
  uint32_t slot;
  void *data;          // block_bytes: the source of a write, the destination of a read
  uint64_t seq_hash;   // write: stored; read: expected
  uint64_t parent_hash;
  kvt_status status = KVT_OK;  // set by run()
  int err = 0;                 // errno behind a KVT_ERR_IO
};

class DiskEngine {
 public:
  // G3 as c asks for it: c.blocks slots of block_bytes in c.dir.
  static kvt_status create(std::unique_ptr<DiskEngine> *out, const DiskConfig &c,
                           uint64_t block_bytes);
  ~DiskEngine();

  // Runs the operations as one batch and sets each one's status: KVT_OK, KVT_ERR_IO (err
  // says why) or, for reads, KVT_ERR_CORRUPT when the slot does not hold what was written
  // (or, keyed, what was written with the key).
  // Batches from several threads run at the same time.
  void run(std::vector<DiskOp> &ops);
  // A message for a failed operation.
  std::string describe(const DiskOp &op) const;
  // A persistent G3: the blocks its file holds intact, oldest write first; for the manager
  // to register at create. Not persistent: none.
  std::vector<Tier::Recovered> take_recovered();
  // kvt_manager_reset of G3: a persistent file no longer holds any block for a later create.
  void forget_all() noexcept;

 private:
  // The config's fault injector, for tests: operations of one kind pass `skip` times, then
  // fail `count` times with `err`.
  struct Fault {
    bool write;
    int err;
    uint64_t skip, count;
    std::atomic<uint64_t> seen{0};
  };
  struct Prepared;
  DiskEngine();
  bool injected(bool write, int *err);

  std::unique_ptr<G3File> file_;
  std::unique_ptr<G3Table> table_;  // persistent G3 only
  uint64_t block_bytes_ = 0, data_bytes_ = 0, slot_bytes_ = 0;
  uint64_t base_ = 0;  // offset of slot 0
  std::unique_ptr<RingPool> rings_;      // io_uring, or
  std::unique_ptr<IoThreads> threads_;   // preadv/pwritev threads
  std::unique_ptr<Fault> fault_;
  std::optional<MacKey> key_;  // g3_key_env: slots carry a keyed MAC
  uint64_t ns_ = 0;            // g3_namespace, in every MAC
};

}  // namespace kvt
