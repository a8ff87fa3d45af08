// Large zeroed allocations straight from the kernel: untouched pages cost nothing, and big
// ones ask for transparent huge pages so that random access misses the TLB less.
#pragma once

#include <cstddef>
#include <memory>

namespace kvt {

void *map_zeroed(size_t bytes);  // throws std::bad_alloc
void unmap(void *p, size_t bytes) noexcept;

// A 4 KiB-aligned heap buffer, padded to whole 4 KiB pages: what O_DIRECT I/O needs.
struct AlignedFree {
  void operator()(void *p) const noexcept;
};
using AlignedBuffer = std::unique_ptr<char, AlignedFree>;
AlignedBuffer aligned_buffer(size_t bytes);  // throws std::bad_alloc
inline constexpr size_t kPage = 4096;
inline constexpr size_t round_to_page(size_t v) { return (v + kPage - 1) / kPage * kPage; }

// An allocator for big tables (the registry): map_zeroed from 2 MiB up, new below.
template <class T>
struct MappedAllocator {
  using value_type = T;
  static constexpr size_t kMapFrom = size_t{2} << 20;
  MappedAllocator() = default;
  template <class U>
  MappedAllocator(const MappedAllocator<U> &) noexcept {}
  T *allocate(size_t n) {
    if (n * sizeof(T) >= kMapFrom) return static_cast<T *>(map_zeroed(n * sizeof(T)));
    return std::allocator<T>().allocate(n);
  }
  void deallocate(T *p, size_t n) noexcept {
    if (n * sizeof(T) >= kMapFrom) unmap(p, n * sizeof(T));
    else std::allocator<T>().deallocate(p, n);
  }
  template <class U>
  bool operator==(const MappedAllocator<U> &) const noexcept { return true; }
};

}  // namespace kvt
