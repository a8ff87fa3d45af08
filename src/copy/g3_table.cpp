#include "copy/g3_table.hpp"

#include <absl/container/flat_hash_set.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <string>

#include "common/error.hpp"
#include "common/log.hpp"
#include "memory/mapping.hpp"
#include "copy/g3_file.hpp"

namespace kvt {

namespace {
constexpr uint64_t kFileMagic = 0x454c494633475654ULL;  // "TVG3FILE"
constexpr uint32_t kVersion = 1;
constexpr uint64_t kHeaderBytes = 4096;
unsigned long long ull(uint64_t v) { return v; }

struct FileHeader {
  uint64_t magic;
  uint32_t version, header_bytes;
  uint32_t page_size, num_layers, num_outer, pad;
  uint64_t chunk_bytes, g3_blocks, g3_namespace, slot_bytes;
  uint64_t file_id;
  uint64_t checksum;  // of the fields above
  uint64_t sum() const { return XXH3_64bits(this, offsetof(FileHeader, checksum)); }
};
static_assert(sizeof(FileHeader) <= kHeaderBytes);

uint64_t random_id() {
  uint64_t v = 0;
  if (getrandom(&v, sizeof v, GRND_NONBLOCK) != ssize_t(sizeof v))
    v = uint64_t(std::chrono::steady_clock::now().time_since_epoch().count()) ^
        (uint64_t(getpid()) << 32);
  return v;
}

// What differs between the file's header and this manager's layout; "" when nothing does.
std::string difference(const FileHeader &h, const G3Table::Layout &l, uint64_t size,
                       uint64_t need) {
  char buf[256];
  auto say = [&](const char *what, uint64_t file, uint64_t mine) {
    std::snprintf(buf, sizeof buf, "was written with %s %llu, this manager has %llu", what,
                  ull(file), ull(mine));
    return std::string(buf);
  };
  if (h.magic != kFileMagic) return "is not a kvtier G3 file";
  if (h.version != kVersion) {  // before the checksum: another version may sum otherwise
    std::snprintf(buf, sizeof buf, "has format version %u, this kvtier reads version %u",
                  h.version, kVersion);
    return buf;
  }
  if (h.checksum != h.sum()) return "has a damaged header (checksum mismatch)";
  if (h.page_size != l.page_size) return say("page_size", h.page_size, l.page_size);
  if (h.num_layers != l.num_layers) return say("num_layers", h.num_layers, l.num_layers);
  if (h.num_outer != l.num_outer) return say("num_outer", h.num_outer, l.num_outer);
  if (h.chunk_bytes != l.chunk_bytes) return say("chunk_bytes", h.chunk_bytes, l.chunk_bytes);
  if (h.g3_blocks != l.g3_blocks) return say("g3_blocks", h.g3_blocks, l.g3_blocks);
  if (h.g3_namespace != l.g3_namespace)
    return say("g3_namespace", h.g3_namespace, l.g3_namespace);
  if (h.slot_bytes != l.slot_bytes) return say("slot size", h.slot_bytes, l.slot_bytes);
  if (size < need) {
    std::snprintf(buf, sizeof buf, "is %llu bytes, shorter than the %llu its header needs",
                  ull(size), ull(need));
    return buf;
  }
  return "";
}

bool all_zero(const void *p, size_t n) {
  const auto *b = static_cast<const unsigned char *>(p);
  return std::all_of(b, b + n, [](unsigned char c) { return c == 0; });
}
}  // namespace

struct G3Table::Record {
  uint64_t seq_hash, parent, gen;
  uint64_t check;  // 0: no block; else check_of(record, slot), written last
};
static_assert(sizeof(G3Table::Record) == 32);

uint64_t G3Table::data_offset(const Layout &l) {
  return kHeaderBytes + round_to_page(l.g3_blocks * sizeof(Record));
}

uint64_t G3Table::file_bytes(const Layout &l) {
  return data_offset(l) + l.g3_blocks * l.slot_bytes;
}

kvt_status G3Table::open(std::unique_ptr<G3Table> *out, G3File &f, uint64_t size,
                         const Layout &l, uint32_t on_mismatch) {
  const uint64_t need = file_bytes(l);
  FileHeader h{};
  bool fresh = size == 0;
  if (!fresh) {
    ssize_t r = pread(f.fd(), &h, sizeof h, 0);
    if (r < 0)
      return fail(KVT_ERR_IO, "G3: cannot read the header of %s: %s", f.path().c_str(),
                  std::strerror(errno));
    // Zeros where the header goes: a creation that never finished.
    fresh = all_zero(&h, sizeof h);
    if (!fresh) {
      std::string diff = difference(h, l, size, need);
      if (!diff.empty() && on_mismatch != KVT_G3_RESET)
        return fail(KVT_ERR_INVALID_ARGUMENT,
                    "G3: %s %s; set g3_on_mismatch to KVT_G3_RESET to start it empty, or use "
                    "another g3_path",
                    f.path().c_str(), diff.c_str());
      if (!diff.empty()) {
        kvt::log(KVT_LOG_WARN, "G3: %s %s; g3_on_mismatch is RESET: it starts empty",
                 f.path().c_str(), diff.c_str());
        fresh = true;
      }
    }
  }
  if (fresh) {
    // Zeros first (every record empty), then the header: a crash in between leaves a
    // header of zeros, which the next open starts afresh.
    if (kvt_status s = f.reset(need); s != KVT_OK) return s;
    h = FileHeader{};
    h.magic = kFileMagic;
    h.version = kVersion;
    h.header_bytes = kHeaderBytes;
    h.page_size = l.page_size;
    h.num_layers = l.num_layers;
    h.num_outer = l.num_outer;
    h.chunk_bytes = l.chunk_bytes;
    h.g3_blocks = l.g3_blocks;
    h.g3_namespace = l.g3_namespace;
    h.slot_bytes = l.slot_bytes;
    h.file_id = random_id();
    h.checksum = h.sum();
    if (pwrite(f.fd(), &h, sizeof h, 0) != ssize_t(sizeof h) || fdatasync(f.fd()) != 0)
      return fail(KVT_ERR_IO, "G3: cannot write the header of %s: %s", f.path().c_str(),
                  std::strerror(errno));
  }
  std::unique_ptr<G3Table> t(new G3Table);
  t->n_ = l.g3_blocks;
  t->map_bytes_ = data_offset(l) - kHeaderBytes;
  t->file_id_ = h.file_id;
  void *p = mmap(nullptr, t->map_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, f.fd(),
                 off_t(kHeaderBytes));
  if (p == MAP_FAILED)
    return fail(KVT_ERR_IO, "G3: cannot map the slot table of %s: %s", f.path().c_str(),
                std::strerror(errno));
  t->records_ = static_cast<Record *>(p);
  *out = std::move(t);
  return KVT_OK;
}

G3Table::~G3Table() {
  if (records_ != nullptr) munmap(records_, map_bytes_);
}

uint64_t G3Table::check_of(const Record &r, uint32_t slot) const noexcept {
  uint64_t c = XXH3_64bits_withSeed(&r, offsetof(Record, check),
                                    file_id_ ^ (uint64_t(slot) * 0x9e3779b97f4a7c15ULL));
  return c != 0 ? c : 1;
}

void G3Table::invalidate(uint32_t slot) noexcept {
  std::atomic_ref(records_[slot].check).store(0, std::memory_order_seq_cst);
}

void G3Table::commit(uint32_t slot, uint64_t seq_hash, uint64_t parent) noexcept {
  Record r{seq_hash, parent, next_gen_.fetch_add(1, std::memory_order_relaxed), 0};
  Record &dst = records_[slot];
  std::atomic_ref(dst.seq_hash).store(r.seq_hash, std::memory_order_relaxed);
  std::atomic_ref(dst.parent).store(r.parent, std::memory_order_relaxed);
  std::atomic_ref(dst.gen).store(r.gen, std::memory_order_relaxed);
  std::atomic_ref(dst.check).store(check_of(r, slot), std::memory_order_release);
}

void G3Table::clear() noexcept {
  for (uint64_t s = 0; s < n_; ++s) invalidate(uint32_t(s));
}

std::vector<Tier::Recovered> G3Table::scan() const {
  struct Found {
    uint64_t gen;
    Tier::Recovered b;
  };
  std::vector<Found> found;
  uint64_t top = 0;
  for (uint64_t s = 0; s < n_; ++s) {
    const Record &r = records_[s];
    if (r.check == 0 || r.check != check_of(r, uint32_t(s))) continue;
    found.push_back({r.gen, {uint32_t(s), r.seq_hash, r.parent}});
    top = std::max(top, r.gen);
  }
  next_gen_.store(top + 1);
  std::sort(found.begin(), found.end(),
            [](const Found &a, const Found &b) { return a.gen < b.gen; });
  // A hash written to two slots (evicted from one, stored again in another): the newest.
  absl::flat_hash_set<uint64_t> seen;
  seen.reserve(found.size());
  std::vector<Tier::Recovered> out(found.size());
  size_t k = found.size();
  for (size_t i = found.size(); i-- > 0;)
    if (seen.insert(found[i].b.seq_hash).second) out[--k] = found[i].b;
  out.erase(out.begin(), out.begin() + k);
  return out;
}

}  // namespace kvt
