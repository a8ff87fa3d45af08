#include "hash/xxh3_wide.hpp"

#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

namespace kvt {

#ifdef KVT_XXH3_X86
uint64_t xxh3_avx2_with_secret(const void *, size_t, const void *, size_t, uint64_t) noexcept;
uint64_t xxh3_avx2_plain(const void *, size_t) noexcept;
uint64_t xxh3_avx512_with_secret(const void *, size_t, const void *, size_t, uint64_t) noexcept;
uint64_t xxh3_avx512_plain(const void *, size_t) noexcept;
#endif

namespace {

uint64_t library_with_secret(const void *data, size_t len, const void *secret,
                             size_t secret_len, uint64_t seed) noexcept {
  return XXH3_64bits_withSecretandSeed(data, len, secret, secret_len, seed);
}

uint64_t library_plain(const void *data, size_t len) noexcept { return XXH3_64bits(data, len); }

}  // namespace

const Xxh3 *xxh3_library() noexcept {
  static constexpr Xxh3 k{&library_with_secret, &library_plain};
  return &k;
}

const Xxh3 *xxh3_avx2_if_supported() noexcept {
#ifdef KVT_XXH3_X86
  static constexpr Xxh3 k{&xxh3_avx2_with_secret, &xxh3_avx2_plain};
  if (__builtin_cpu_supports("avx2")) return &k;
#endif
  return nullptr;
}

const Xxh3 *xxh3_avx512_if_supported() noexcept {
#ifdef KVT_XXH3_X86
  static constexpr Xxh3 k{&xxh3_avx512_with_secret, &xxh3_avx512_plain};
  if (__builtin_cpu_supports("avx512f")) return &k;
#endif
  return nullptr;
}

const Xxh3 &xxh3() noexcept {
  static const Xxh3 *const chosen = [] {
#ifdef KVT_XXH3_X86
    __builtin_cpu_init();  // in case a static constructor hashes first
#endif
    if (const Xxh3 *v = xxh3_avx512_if_supported()) return v;
    if (const Xxh3 *v = xxh3_avx2_if_supported()) return v;
    return xxh3_library();
  }();
  return *chosen;
}

}  // namespace kvt
