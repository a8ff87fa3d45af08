// xxhash's XXH3 with its AVX-512 loop (xxh3_wide.hpp): compiled with -mavx512f and called
// only where the CPU has AVX-512F.
#define XXH_VECTOR XXH_AVX512
#define KVT_XXH3_VARIANT avx512
#include "hash/xxh3_variant.inc"
