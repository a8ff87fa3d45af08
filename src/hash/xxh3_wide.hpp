// XXH3 with the widest vector unit the CPU has. Debian's libxxhash is built for SSE2;
// xxhash's own AVX2 and AVX-512 loops, compiled for those units in xxh3_avx2.cpp and
// xxh3_avx512.cpp, give the same hashes 2.5-5x faster on 2 KiB and more (docs/BENCHMARKS.md,
// issue 25): a block's tokens, and the checksums of G3's and G4's block bytes. Those two
// files include nothing but xxhash.h (C, all static), so that no code built for a unit the
// CPU may lack is shared with other files.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvt {

struct Xxh3 {
  uint64_t (*with_secret)(const void *data, size_t len, const void *secret, size_t secret_len,
                          uint64_t seed) noexcept;  // XXH3_64bits_withSecretandSeed
  uint64_t (*plain)(const void *data, size_t len) noexcept;  // XXH3_64bits
};

// The variant for this CPU, chosen once: AVX-512, AVX2, else the library's.
const Xxh3 &xxh3() noexcept;

// Each variant, for the tests that hold them to the library's hashes: null where this build
// or this CPU lacks it.
const Xxh3 *xxh3_library() noexcept;
const Xxh3 *xxh3_avx2_if_supported() noexcept;
const Xxh3 *xxh3_avx512_if_supported() noexcept;

}  // namespace kvt
