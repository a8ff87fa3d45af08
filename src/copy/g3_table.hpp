// The metadata of a persistent G3 file (docs/G3_FORMAT.md): a 4 KiB file header that names
// the layout it was written for, and a table of one 32-byte record per slot that says which
// block the slot holds. A record is cleared before its slot is written and set, checksum
// last, only once the slot's write has completed, so that after a crash at any moment a
// valid record names a slot whose bytes are whole.
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

#include "block/tier.hpp"
#include "kvtier.h"

namespace kvt {

class G3File;

class G3Table {
 public:
  struct Record;  // one slot's 32 bytes in the table
  // The file's layout for config c and slots of slot_bytes.
  struct Layout {
    uint32_t page_size, num_layers, num_outer;
    uint64_t chunk_bytes, g3_blocks, g3_namespace, slot_bytes;
  };
  // Where slot data starts, and the whole file's size.
  static uint64_t data_offset(const Layout &l);
  static uint64_t file_bytes(const Layout &l);

  // Reads the header of f (of `size` bytes; 0: new) and maps its table. A file of another
  // layout, namespace or format version, or not a G3 file at all: KVT_ERR_INVALID_ARGUMENT
  // naming the difference, unless on_mismatch is KVT_G3_RESET, which starts it empty. Call
  // before f takes O_DIRECT.
  static kvt_status open(std::unique_ptr<G3Table> *out, G3File &f, uint64_t size,
                         const Layout &l, uint32_t on_mismatch);
  ~G3Table();
  G3Table(const G3Table &) = delete;
  G3Table &operator=(const G3Table &) = delete;

  // Before a slot's write is issued: its record no longer names any block.
  void invalidate(uint32_t slot) noexcept;
  // After a slot's write has completed: its record names the block written there.
  void commit(uint32_t slot, uint64_t seq_hash, uint64_t parent) noexcept;
  // kvt_manager_reset of G3: no record names a block any more.
  void clear() noexcept;
  // The blocks the valid records name, oldest write first, one slot per hash (the newest).
  std::vector<Tier::Recovered> scan() const;

 private:
  G3Table() = default;
  uint64_t check_of(const Record &r, uint32_t slot) const noexcept;

  Record *records_ = nullptr;  // MAP_SHARED over the table: stores reach the page cache
  uint64_t n_ = 0, map_bytes_ = 0;
  uint64_t file_id_ = 0;  // random per file (and per reset): seeds the records' checksums
  mutable std::atomic<uint64_t> next_gen_{1};
};

}  // namespace kvt
