// xxhash's XXH3 with its AVX2 loop (xxh3_wide.hpp): compiled with -mavx2 and called only
// where the CPU has AVX2.
#define XXH_VECTOR XXH_AVX2
#define KVT_XXH3_VARIANT avx2
#include "hash/xxh3_variant.inc"
