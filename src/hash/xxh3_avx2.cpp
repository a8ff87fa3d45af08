// xxhash's XXH3 with its AVX2 loop (xxh3_wide.hpp): compiled with -mavx2 and called only
// where the CPU has AVX2.
#define XXH_INLINE_ALL
#define XXH_VECTOR XXH_AVX2
#include <xxhash.h>

namespace kvt {

uint64_t xxh3_avx2_with_secret(const void *data, size_t len, const void *secret,
                               size_t secret_len, uint64_t seed) noexcept {
  return XXH3_64bits_withSecretandSeed(data, len, secret, secret_len, seed);
}

uint64_t xxh3_avx2_plain(const void *data, size_t len) noexcept {
  return XXH3_64bits(data, len);
}

}  // namespace kvt
