#include "memory/tier_memory.hpp"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>

#include "common/error.hpp"
#include "memory/cuda.hpp"

namespace kvt {

TierMemory::~TierMemory() {
  if (owner_ == Owner::mmap) {
    if (pinned_) cuda::host_unregister(base_);
    munmap(base_, bytes_);
  } else if (owner_ == Owner::cuda) {
    cuda::free(base_, device_);
  }
}

kvt_status TierMemory::init_host(uint64_t blocks, const Geometry &g, bool pin) {
  geo_ = g;
  kind_ = KVT_MEMORY_HOST;
  bytes_ = blocks * g.block_bytes();
  if (bytes_ == 0) return KVT_OK;
  // Anonymous mmap: page-aligned, zero-filled, and untouched pages cost nothing.
  void *p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    return fail(KVT_ERR_NO_MEMORY, "mmap of %zu bytes for %llu blocks: %s", bytes_,
                (unsigned long long)blocks, std::strerror(errno));
  base_ = static_cast<char *>(p);
  owner_ = Owner::mmap;
  pinned_ = pin && cuda::host_register(base_, bytes_);
  return KVT_OK;
}

kvt_status TierMemory::init_cuda(uint64_t blocks, const Geometry &g, int device) {
  geo_ = g;
  bytes_ = blocks * g.block_bytes();
  if (bytes_ > 0) {
    void *p = nullptr;
    if (kvt_status s = cuda::alloc(&p, bytes_, device); s != KVT_OK) return s;
    base_ = static_cast<char *>(p);
    owner_ = Owner::cuda;
  }
  kind_ = KVT_MEMORY_CUDA;
  device_ = device;
  return KVT_OK;
}

kvt_status TierMemory::check_on_device(const Geometry &g, const kvt_g1_layout &layout,
                                      uint64_t blocks, const char *what) {
  const size_t pairs = size_t{g.num_layers} * g.num_outer;
  for (size_t i = 0; i < pairs && blocks > 0 && g.chunk_bytes > 0; ++i) {
    const char *first = static_cast<const char *>(layout.bases[i]);
    const char *last = first + (blocks - 1) * layout.strides[i] + g.chunk_bytes - 1;
    if (!cuda::on_device(first, layout.cuda_device) || !cuda::on_device(last, layout.cuda_device))
      return fail(KVT_ERR_INVALID_ARGUMENT,
                  "%s->bases[%zu]: %p..%p (%llu blocks) is not all memory of CUDA device %d",
                  what, i, static_cast<const void *>(first), static_cast<const void *>(last),
                  static_cast<unsigned long long>(blocks), layout.cuda_device);
  }
  return KVT_OK;
}

void TierMemory::init_engine(const Geometry &g, const kvt_g1_layout &layout) {
  geo_ = g;
  kind_ = static_cast<kvt_memory_kind>(layout.memory);
  device_ = layout.cuda_device;
  size_t pairs = size_t{g.num_layers} * g.num_outer;
  bases_.resize(pairs);
  strides_.assign(layout.strides, layout.strides + pairs);
  for (size_t i = 0; i < pairs; ++i)
    bases_[i] = static_cast<char *>(const_cast<void *>(layout.bases[i]));
  // Contiguous when every block holds its chunks back to back in (layer, outer) order.
  base_ = bases_[0];
  for (size_t i = 0; i < pairs && contiguous_; ++i)
    contiguous_ = strides_[i] == g.block_bytes() && bases_[i] == base_ + i * g.chunk_bytes;
}

void *TierMemory::block(uint32_t slot) const noexcept {
  if (!contiguous_ || base_ == nullptr) return nullptr;
  return base_ + uint64_t{slot} * geo_.block_bytes();
}

void *TierMemory::chunk(uint32_t slot, uint32_t layer, uint32_t outer) const noexcept {
  size_t pair = size_t{layer} * geo_.num_outer + outer;
  if (!bases_.empty()) return bases_[pair] + uint64_t{slot} * strides_[pair];
  if (base_ == nullptr) return nullptr;
  return base_ + uint64_t{slot} * geo_.block_bytes() + pair * geo_.chunk_bytes;
}

}  // namespace kvt
