// G1's bytes as kvtier-replay writes ("computes") and checks them: host memory directly, or
// CUDA device memory (--g1-memory cuda), written by a kernel and checked through a host copy.
// g1_bytes_cuda.cu implements it with the CUDA runtime; g1_bytes_host.cpp, built without
// CUDA, has host only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "kvtier.h"

namespace kvt::replay {

// True when --g1-memory cuda can run here: built with CUDA, and device 0 is present; else
// false with *why set.
bool g1_cuda_ready(std::string *why);

// The engine's G1 (--mode engine): `bytes` of host or device memory; nullptr, and *error
// set, on failure.
void *g1_alloc(bool cuda, size_t bytes, std::string *error);
void g1_free(bool cuda, void *p);

// A block of G1 at p (kvt_block_data's pointer, or chunk (0, 0) of a block-contiguous G1):
// fill writes the pattern of `hash`; holds checks it. False from fill, or from holds with
// *error set, means the device copy failed.
bool g1_fill(bool cuda, void *p, size_t len, uint64_t hash, std::string *error);
// Bytes [from, from + len) of that pattern only (a layer of a block), at p + from.
bool g1_fill_range(bool cuda, void *p, size_t from, size_t len, uint64_t hash,
                   std::string *error);
bool g1_holds(bool cuda, const void *p, size_t len, uint64_t hash, std::string *error);

// The start of a block of a manager's G1, whatever memory it is in: the block's data pointer
// for host memory, its chunk (0, 0) for CUDA memory (whose blocks are contiguous).
kvt_status g1_block_ptr(void **out, size_t *len, kvt_manager *m, kvt_block b, bool cuda);

}  // namespace kvt::replay
