// Where one tier's block bytes live, and how to find chunk (layer, outer) of a slot.
// Library-owned tiers use the compact layout: block b is one contiguous run of block_bytes.
// Engine-owned G1 uses the engine's base pointer and stride per (layer, outer).
#pragma once

#include <cstdint>
#include <vector>

#include "kvtier.h"

namespace kvt {

struct Geometry {
  uint32_t num_layers, num_outer;
  uint64_t chunk_bytes;
  uint64_t block_bytes() const { return uint64_t{num_layers} * num_outer * chunk_bytes; }
};

class TierMemory {
 public:
  TierMemory() = default;  // no bytes: G3 until its file arrives, or a 0-byte geometry
  TierMemory(const TierMemory &) = delete;
  TierMemory &operator=(const TierMemory &) = delete;
  ~TierMemory();

  // Page-aligned host memory, pinned when `pin` and CUDA can. Zero-filled.
  kvt_status init_host(uint64_t blocks, const Geometry &g, bool pin);
  kvt_status init_cuda(uint64_t blocks, const Geometry &g, int device);
  // Engine-owned memory; the layout has been validated by the caller (and, for CUDA memory,
  // by check_on_device).
  void init_engine(const Geometry &g, const kvt_g1_layout &layout);
  // For a CUDA layout of `blocks` blocks: KVT_ERR_INVALID_ARGUMENT naming the first region
  // whose first or last byte is not memory of the layout's device (host memory passed as
  // device memory would fail every copy, or worse).
  static kvt_status check_on_device(const Geometry &g, const kvt_g1_layout &layout,
                                    uint64_t blocks, const char *what);

  kvt_memory_kind kind() const noexcept { return kind_; }
  bool has_bytes() const noexcept { return kind_ != KVT_MEMORY_AUTO; }
  bool host_visible() const noexcept { return kind_ == KVT_MEMORY_HOST; }
  // The whole allocation when it is host memory pinned (and mapped) for the GPU, else null.
  void *pinned_base() const noexcept { return pinned_ ? base_ : nullptr; }
  size_t bytes() const noexcept { return bytes_; }
  // Base of a contiguous block, or nullptr when the layout scatters its chunks.
  void *block(uint32_t slot) const noexcept;
  void *chunk(uint32_t slot, uint32_t layer, uint32_t outer) const noexcept;

 private:
  Geometry geo_{};
  kvt_memory_kind kind_ = KVT_MEMORY_AUTO;  // AUTO here means "no bytes"
  enum class Owner { none, mmap, cuda } owner_ = Owner::none;
  bool pinned_ = false;
  int device_ = 0;
  char *base_ = nullptr;  // compact layout base, or the owned allocation
  size_t bytes_ = 0;
  bool contiguous_ = true;
  std::vector<char *> bases_;        // engine layout: per (layer, outer)
  std::vector<uint64_t> strides_;
};

}  // namespace kvt
