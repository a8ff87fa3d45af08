#include "memory/mapping.hpp"

#include <sys/mman.h>

#include <cstdlib>
#include <new>

namespace kvt {

void *map_zeroed(size_t bytes) {
  if (bytes == 0) return nullptr;
  void *p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  constexpr size_t kHuge = size_t{2} << 20;
  if (bytes >= kHuge) madvise(p, bytes, MADV_HUGEPAGE);  // advice only: failure is harmless
  return p;
}

void AlignedFree::operator()(void *p) const noexcept { std::free(p); }

AlignedBuffer aligned_buffer(size_t bytes) {
  void *p = std::aligned_alloc(kPage, round_to_page(bytes == 0 ? 1 : bytes));
  if (p == nullptr) throw std::bad_alloc();
  return AlignedBuffer(static_cast<char *>(p));
}

void unmap(void *p, size_t bytes) noexcept {
  if (p != nullptr) munmap(p, bytes);
}

}  // namespace kvt
