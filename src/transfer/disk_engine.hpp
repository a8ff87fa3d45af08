// G3: one preallocated file per manager. Slot s lives at s * slot_bytes and holds the
// block's data, padded to 4 KiB, then a 4 KiB header with the sequence hash and an xxh3
// checksum of the data, so that a torn or corrupt slot is caught on every read.
// I/O is O_DIRECT where the filesystem allows it and batched through io_uring, with a
// thread pool doing preadv/pwritev where io_uring is unavailable.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kvtier.h"
#include "transfer/worker_pool.hpp"

struct io_uring;

namespace kvt {

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
  // dir NULL: a fresh temporary directory, removed at destruction.
  static kvt_status create(std::unique_ptr<DiskEngine> *out, const char *dir, uint64_t slots,
                           uint64_t block_bytes, kvt_io_engine mode, WorkerPool &pool);
  ~DiskEngine();

  // Runs the operations as one batch and sets each one's status: KVT_OK, KVT_ERR_IO (err
  // says why) or, for reads, KVT_ERR_CORRUPT when the slot does not hold what was written.
  void run(std::vector<DiskOp> &ops);
  // A message for a failed operation.
  std::string describe(const DiskOp &op) const;

 private:
  struct Fault;  // test seam: KVTIER_FAULT_G3=read|write:ERRNO:SKIP:COUNT
  struct Prepared;
  explicit DiskEngine(WorkerPool &pool);
  bool injected(bool write, int *err);
  void submit_uring(std::vector<Prepared> &p);
  void submit_threads(std::vector<Prepared> &p);

  WorkerPool &pool_;
  std::string dir_, path_;
  bool own_dir_ = false;
  int fd_ = -1;
  uint64_t block_bytes_ = 0, data_bytes_ = 0, slot_bytes_ = 0;
  std::unique_ptr<io_uring> ring_;
  std::mutex ring_mu_;
  std::unique_ptr<Fault> fault_;
};

}  // namespace kvt
