#include "transfer/disk_engine.hpp"

#include <fcntl.h>
#include <liburing.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>
#include <xxhash.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "common/error.hpp"
#include "memory/mapping.hpp"

namespace kvt {

namespace {
constexpr uint64_t kAlign = 4096;
constexpr uint64_t kMagic = 0x544c53334754564bULL;  // "KVTG3SLT"
constexpr unsigned kRingDepth = 64;

uint64_t round_up(uint64_t v) { return round_to_page(v); }

struct SlotHeader {
  uint64_t magic;
  uint64_t seq_hash, parent_hash, data_len, data_checksum;
  uint64_t header_checksum;  // of the fields above
  uint64_t checksum() const { return XXH3_64bits(this, offsetof(SlotHeader, header_checksum)); }
};

}  // namespace

struct DiskEngine::Fault {
  bool write;
  int err;
  uint64_t skip, count;
  std::atomic<uint64_t> seen{0};
};

// One operation made ready for the kernel: aligned data (the caller's buffer, or a bounce
// buffer when it is not aligned), its header page, and two iovecs.
struct DiskEngine::Prepared {
  DiskOp *op;
  AlignedBuffer bounce, header;
  iovec iov[2];
  ssize_t expect;
  ssize_t result = 0;  // bytes, or -errno
};

DiskEngine::DiskEngine(WorkerPool &pool) : pool_(pool) {}

kvt_status DiskEngine::create(std::unique_ptr<DiskEngine> *out, const char *dir, uint64_t slots,
                              uint64_t block_bytes, kvt_io_engine mode, WorkerPool &pool) {
  std::unique_ptr<DiskEngine> e(new DiskEngine(pool));
  e->block_bytes_ = block_bytes;
  e->data_bytes_ = round_up(block_bytes);
  e->slot_bytes_ = e->data_bytes_ + kAlign;
  if (dir == nullptr) {
    std::string tmpl = (std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp");
    tmpl += "/kvtier-" + std::string(6, 'X');  // mkdtemp's template
    if (mkdtemp(tmpl.data()) == nullptr)
      return fail(KVT_ERR_IO, "G3: cannot create a temporary directory %s: %s", tmpl.c_str(),
                  std::strerror(errno));
    e->dir_ = tmpl;
    e->own_dir_ = true;
  } else {
    e->dir_ = dir;
  }
  static std::atomic<unsigned> serial{0};
  e->path_ = e->dir_ + "/kvtier-g3-" + std::to_string(getpid()) + "-" +
             std::to_string(serial.fetch_add(1)) + ".bin";
  int flags = O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC;
  e->fd_ = open(e->path_.c_str(), flags | O_DIRECT, 0600);
  if (e->fd_ < 0 && errno == EINVAL) {
    e->fd_ = open(e->path_.c_str(), flags, 0600);
    if (e->fd_ >= 0)
      std::fprintf(stderr, "kvtier: %s does not take O_DIRECT; G3 uses buffered I/O\n",
                   e->dir_.c_str());
  }
  if (e->fd_ < 0)
    return fail(KVT_ERR_IO, "G3: cannot create %s: %s", e->path_.c_str(), std::strerror(errno));
  uint64_t bytes = slots * e->slot_bytes_;
  if (int r = posix_fallocate(e->fd_, 0, off_t(bytes)); r != 0)
    return fail(r == ENOSPC ? KVT_ERR_NO_SPACE : KVT_ERR_IO,
                "G3: cannot preallocate %llu bytes for %llu blocks in %s: %s",
                (unsigned long long)bytes, (unsigned long long)slots, e->dir_.c_str(),
                std::strerror(r));
  // An AUTO choice can be overridden from outside: containers whose seccomp profile forbids
  // io_uring, and valgrind, which does not model io_uring's writes into user buffers.
  if (const char *io = std::getenv("KVTIER_G3_IO"); io && mode == KVT_IO_AUTO &&
                                                    std::strcmp(io, "threads") == 0)
    mode = KVT_IO_THREADS;
  if (mode != KVT_IO_THREADS) {
    auto ring = std::make_unique<io_uring>();
    int r = io_uring_queue_init(kRingDepth, ring.get(), 0);
    if (r == 0) {
      e->ring_ = std::move(ring);
    } else if (mode == KVT_IO_URING) {
      return fail(KVT_ERR_UNSUPPORTED, "G3: io_uring is unavailable: %s", std::strerror(-r));
    }
  }
  if (const char *f = std::getenv("KVTIER_FAULT_G3")) {
    char op[8] = {};
    int err = 0;
    unsigned long long skip = 0, count = 0;
    if (std::sscanf(f, "%7[a-z]:%d:%llu:%llu", op, &err, &skip, &count) == 4) {
      e->fault_ = std::make_unique<Fault>();
      e->fault_->write = std::strcmp(op, "write") == 0;
      e->fault_->err = err;
      e->fault_->skip = skip;
      e->fault_->count = count;
    }
  }
  *out = std::move(e);
  return KVT_OK;
}

DiskEngine::~DiskEngine() {
  if (ring_) io_uring_queue_exit(ring_.get());
  if (fd_ >= 0) {
    close(fd_);
    unlink(path_.c_str());
  }
  if (own_dir_) {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
}

bool DiskEngine::injected(bool write, int *err) {
  if (!fault_ || fault_->write != write) return false;
  uint64_t n = fault_->seen.fetch_add(1);
  if (n < fault_->skip || n >= fault_->skip + fault_->count) return false;
  *err = fault_->err;
  return true;
}

std::string DiskEngine::describe(const DiskOp &op) const {
  char buf[256];
  if (op.status == KVT_ERR_CORRUPT)
    std::snprintf(buf, sizeof buf,
                  "G3 slot %u of %s does not hold block 0x%llx intact (checksum or hash "
                  "mismatch)",
                  op.slot, path_.c_str(), (unsigned long long)op.seq_hash);
  else
    std::snprintf(buf, sizeof buf, "G3 %s of slot %u in %s failed: %s",
                  op.write ? "write" : "read", op.slot, path_.c_str(), std::strerror(op.err));
  return buf;
}

void DiskEngine::submit_uring(std::vector<Prepared> &p) {
  std::lock_guard lock(ring_mu_);
  size_t next = 0, inflight = 0;
  while (next < p.size() || inflight > 0) {
    unsigned queued = 0;
    while (next < p.size() && inflight + queued < kRingDepth) {
      io_uring_sqe *sqe = io_uring_get_sqe(ring_.get());
      if (sqe == nullptr) break;
      Prepared &x = p[next];
      off_t off = off_t(uint64_t(x.op->slot) * slot_bytes_);
      if (x.op->write) io_uring_prep_writev(sqe, fd_, x.iov, 2, off);
      else io_uring_prep_readv(sqe, fd_, x.iov, 2, off);
      io_uring_sqe_set_data64(sqe, next);
      ++next;
      ++queued;
    }
    // Submits what was queued and waits for at least one completion.
    int r = io_uring_submit_and_wait(ring_.get(), 1);
    if (r < 0 && r != -EINTR && r != -EAGAIN && r != -EBUSY) {
      // The ring refused the new entries: they never reached the kernel.
      for (size_t i = next - queued; i < next; ++i) p[i].result = r;
      queued = 0;
    }
    inflight += queued;
    io_uring_cqe *cqe = nullptr;
    while (inflight > 0 && io_uring_peek_cqe(ring_.get(), &cqe) == 0) {
      p[io_uring_cqe_get_data64(cqe)].result = cqe->res;
      io_uring_cqe_seen(ring_.get(), cqe);
      --inflight;
    }
  }
}

void DiskEngine::submit_threads(std::vector<Prepared> &p) {
  pool_.parallel_for(p.size(), [&](size_t i) {
    Prepared &x = p[i];
    off_t off = off_t(uint64_t(x.op->slot) * slot_bytes_);
    ssize_t r = x.op->write ? pwritev(fd_, x.iov, 2, off) : preadv(fd_, x.iov, 2, off);
    x.result = r < 0 ? -errno : r;
  });
}

void DiskEngine::run(std::vector<DiskOp> &ops) {
  std::vector<Prepared> batch;
  batch.reserve(ops.size());
  for (DiskOp &op : ops) {
    if (injected(op.write, &op.err)) {
      op.status = KVT_ERR_IO;
      continue;
    }
    Prepared &x = batch.emplace_back();
    x.op = &op;
    char *data = static_cast<char *>(op.data);
    bool aligned_ok =
        reinterpret_cast<uintptr_t>(data) % kAlign == 0 && block_bytes_ % kAlign == 0;
    if (!aligned_ok) {  // O_DIRECT needs aligned buffers and lengths: go through a bounce
      x.bounce = aligned_buffer(data_bytes_);
      if (op.write) {
        std::memcpy(x.bounce.get(), data, block_bytes_);
        std::memset(x.bounce.get() + block_bytes_, 0, data_bytes_ - block_bytes_);
      }
      data = x.bounce.get();
    }
    x.header = aligned_buffer(kAlign);
    std::memset(x.header.get(), 0, kAlign);
    if (op.write) {
      auto *h = reinterpret_cast<SlotHeader *>(x.header.get());
      h->magic = kMagic;
      h->seq_hash = op.seq_hash;
      h->parent_hash = op.parent_hash;
      h->data_len = block_bytes_;
      h->data_checksum = XXH3_64bits(data, block_bytes_);
      h->header_checksum = h->checksum();
    }
    x.iov[0] = {data, data_bytes_};
    x.iov[1] = {x.header.get(), kAlign};
    x.expect = ssize_t(data_bytes_ + kAlign);
  }
  if (ring_) submit_uring(batch); else submit_threads(batch);
  for (Prepared &x : batch) {
    DiskOp &op = *x.op;
    if (x.result != x.expect) {
      op.status = KVT_ERR_IO;
      op.err = x.result < 0 ? int(-x.result) : EIO;  // a short transfer counts as EIO
      continue;
    }
    if (op.write) continue;
    auto *h = reinterpret_cast<const SlotHeader *>(x.header.get());
    const char *data = static_cast<const char *>(x.iov[0].iov_base);
    bool intact = h->magic == kMagic && h->header_checksum == h->checksum() &&
                  h->seq_hash == op.seq_hash && h->data_len == block_bytes_ &&
                  XXH3_64bits(data, block_bytes_) == h->data_checksum;
    if (!intact) {
      op.status = KVT_ERR_CORRUPT;
      continue;
    }
    if (x.bounce) std::memcpy(op.data, x.bounce.get(), block_bytes_);
  }
}

}  // namespace kvt
