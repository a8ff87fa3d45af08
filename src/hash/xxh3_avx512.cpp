// xxhash's XXH3 with its AVX-512 loop (xxh3_wide.hpp): compiled with -mavx512f and called only
// where the CPU has AVX-512F.
#define XXH_INLINE_ALL
#define XXH_VECTOR XXH_AVX512
#include <xxhash.h>

namespace kvt {

uint64_t xxh3_avx512_with_secret(const void *data, size_t len, const void *secret,
                               size_t secret_len, uint64_t seed) noexcept {
  return XXH3_64bits_withSecretandSeed(data, len, secret, secret_len, seed);
}

uint64_t xxh3_avx512_plain(const void *data, size_t len) noexcept {
  return XXH3_64bits(data, len);
}

}  // namespace kvt
