#include "copy/disk_engine.hpp"

#include <xxhash.h>

#include <cstdio>
#include <cstring>

#include "common/error.hpp"
#include "common/keyed_mac.hpp"
#include "hash/xxh3_wide.hpp"
#include "memory/mapping.hpp"
#include "copy/disk_io.hpp"
#include "copy/g3_file.hpp"
#include "copy/g3_table.hpp"

namespace kvt {

namespace {
constexpr uint64_t kAlign = 4096;
constexpr uint64_t kMagic = 0x544c53334754564bULL;       // "KVTG3SLT"
constexpr uint64_t kKeyedMagic = 0x4b4c53334754564bULL;  // "KVTG3SLK": g3_key_env

struct SlotHeader {
  uint64_t magic;
  uint64_t seq_hash, parent_hash, data_len, data_checksum;  // keyed: no data checksum (0)
  uint64_t header_checksum;  // of the fields above
  uint8_t mac[kMacBytes];    // keyed: of the fields above, g3_namespace and the data
  uint64_t checksum() const { return XXH3_64bits(this, offsetof(SlotHeader, header_checksum)); }
};

// The MAC binds the bytes to their block, chain, length and namespace: a slot copied from
// another block, another namespace's file or another key's is refused.
void slot_mac(uint8_t out[kMacBytes], const MacKey &key, const SlotHeader &h, uint64_t ns,
              const void *data, size_t len) {
  keyed_mac(out, key.data(), {{&h, offsetof(SlotHeader, mac)}, {&ns, sizeof ns}, {data, len}});
}

}  // namespace

// One operation made ready for the kernel: aligned data (the caller's buffer, or a bounce
// buffer when it is not aligned), its header page, and the request.
struct DiskEngine::Prepared {
  DiskOp *op;
  AlignedBuffer bounce, header;
};

DiskEngine::DiskEngine() = default;
DiskEngine::~DiskEngine() = default;

kvt_status DiskEngine::create(std::unique_ptr<DiskEngine> *out, const DiskConfig &c,
                              uint64_t block_bytes) {
  std::unique_ptr<DiskEngine> e(new DiskEngine);
  if (c.key_env != nullptr) {
    MacKey key;
    if (kvt_status s = read_mac_key(&key, "g3_key_env", c.key_env); s != KVT_OK) return s;
    e->key_ = key;
  }
  e->ns_ = c.ns;
  e->block_bytes_ = block_bytes;
  e->data_bytes_ = round_to_page(block_bytes);
  e->slot_bytes_ = e->data_bytes_ + kAlign;
  if (c.persist) {
    uint64_t size = 0;
    const G3Table::Layout l{c.page_size,   c.num_layers, c.num_outer,   c.chunk_bytes,
                            c.blocks,      c.ns,         e->slot_bytes_};
    if (kvt_status s = G3File::open_persistent(&e->file_, c.dir, &size); s != KVT_OK)
      return s;
    if (kvt_status s = G3Table::open(&e->table_, *e->file_, size, l, c.on_mismatch);
        s != KVT_OK)
      return s;
    if (kvt_status s = e->file_->enable_direct(); s != KVT_OK) return s;
    e->base_ = G3Table::data_offset(l);
  } else if (kvt_status s = G3File::create(&e->file_, c.dir, c.blocks * e->slot_bytes_);
             s != KVT_OK) {
    return s;
  }
  if (c.io != KVT_IO_THREADS) {
    int r = RingPool::create(&e->rings_, c.rings);
    if (r != 0 && c.io == KVT_IO_URING)
      return fail(KVT_ERR_UNSUPPORTED, "G3: io_uring is unavailable: %s", std::strerror(-r));
  }
  if (!e->rings_) e->threads_ = std::make_unique<IoThreads>(c.io_threads);
  if (c.fault_op != KVT_G3_FAULT_OFF) {
    e->fault_ = std::make_unique<Fault>();
    e->fault_->write = c.fault_op == KVT_G3_FAULT_WRITE;
    e->fault_->err = c.fault_errno;
    e->fault_->skip = c.fault_skip;
    e->fault_->count = c.fault_count;
  }
  *out = std::move(e);
  return KVT_OK;
}

bool DiskEngine::injected(bool write, int *err) {
  if (!fault_ || fault_->write != write) return false;
  uint64_t n = fault_->seen.fetch_add(1);
  if (n < fault_->skip || n - fault_->skip >= fault_->count) return false;
  *err = fault_->err;
  return true;
}

std::string DiskEngine::describe(const DiskOp &op) const {
  char buf[256];
  if (op.status == KVT_ERR_CORRUPT)
    std::snprintf(buf, sizeof buf, "G3 slot %u of %s does not hold block 0x%llx intact (%s)",
                  op.slot, file_->path().c_str(), (unsigned long long)op.seq_hash,
                  key_ ? "its MAC, checksum or hash does not match: written without this "
                         "G3 key (g3_key_env), or altered"
                       : "checksum or hash mismatch");
  else
    std::snprintf(buf, sizeof buf, "G3 %s of slot %u in %s failed: %s",
                  op.write ? "write" : "read", op.slot, file_->path().c_str(),
                  std::strerror(op.err));
  return buf;
}

std::vector<Tier::Recovered> DiskEngine::take_recovered() {
  if (!table_) return {};
  return table_->scan();
}

void DiskEngine::forget_all() noexcept {
  if (table_) table_->clear();
}

void DiskEngine::run(std::vector<DiskOp> &ops) {
  std::vector<Prepared> batch;
  std::vector<IoRequest> req;
  batch.reserve(ops.size());
  req.reserve(ops.size());
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
      if (table_) table_->invalidate(op.slot);  // before the slot's bytes start to change
      auto *h = reinterpret_cast<SlotHeader *>(x.header.get());
      h->magic = key_ ? kKeyedMagic : kMagic;
      h->seq_hash = op.seq_hash;
      h->parent_hash = op.parent_hash;
      h->data_len = block_bytes_;
      h->data_checksum = key_ ? 0 : xxh3().plain(data, block_bytes_);
      h->header_checksum = h->checksum();
      if (key_) slot_mac(h->mac, *key_, *h, ns_, data, block_bytes_);
    }
    IoRequest &r = req.emplace_back();
    r.write = op.write;
    r.offset = off_t(base_ + uint64_t(op.slot) * slot_bytes_);
    r.iov[0] = {data, data_bytes_};
    r.iov[1] = {x.header.get(), kAlign};
  }
  if (rings_) rings_->run(file_->fd(), req.data(), req.size());
  else threads_->run(file_->fd(), req.data(), req.size());
  const ssize_t expect = ssize_t(data_bytes_ + kAlign);
  for (size_t i = 0; i < batch.size(); ++i) {
    Prepared &x = batch[i];
    DiskOp &op = *x.op;
    if (req[i].result != expect) {
      op.status = KVT_ERR_IO;
      op.err = req[i].result < 0 ? int(-req[i].result) : EIO;  // a short transfer counts as EIO
      continue;
    }
    if (op.write) {
      if (table_) table_->commit(op.slot, op.seq_hash, op.parent_hash);  // now whole
      continue;
    }
    // Every read is checked, whichever path it took.
    auto *h = reinterpret_cast<const SlotHeader *>(x.header.get());
    const char *data = static_cast<const char *>(req[i].iov[0].iov_base);
    bool intact = h->magic == (key_ ? kKeyedMagic : kMagic) &&
                  h->header_checksum == h->checksum() && h->seq_hash == op.seq_hash &&
                  h->data_len == block_bytes_;
    if (intact && key_) {
      uint8_t want[kMacBytes];
      slot_mac(want, *key_, *h, ns_, data, block_bytes_);
      intact = mac_equal(want, h->mac);
    } else if (intact) {
      intact = xxh3().plain(data, block_bytes_) == h->data_checksum;
    }
    if (!intact) {
      op.status = KVT_ERR_CORRUPT;
      continue;
    }
    if (x.bounce) std::memcpy(op.data, x.bounce.get(), block_bytes_);
  }
}

}  // namespace kvt
