// Versioned structs: the structs of the C ABI that start with struct_size only ever grow at
// their end, and a program built against an older kvtier.h passes the older, shorter size.
// Every size from a struct's first published one (in the release that introduced it) up to
// this library's is accepted: an input struct is read over a full one that holds the
// defaults, so the fields the caller lacks keep them; an output struct is written only up to
// the caller's size.
#pragma once

#include <cstddef>
#include <cstring>
#include <type_traits>

#include "common/error.hpp"
#include "kvtier.h"

namespace kvt {

// The name and first published size of each versioned struct.
template <class T> struct Versioned;
template <> struct Versioned<kvt_manager_config> {
  static constexpr const char *name = "kvt_manager_config";
  static constexpr size_t first = 152;
};
template <> struct Versioned<kvt_g1_layout> {
  static constexpr const char *name = "kvt_g1_layout";
  static constexpr size_t first = 32;
};
template <> struct Versioned<kvt_tier_stats> {
  static constexpr const char *name = "kvt_tier_stats";
  static constexpr size_t first = 112;
};
template <> struct Versioned<kvt_transfer_stats> {
  static constexpr const char *name = "kvt_transfer_stats";
  static constexpr size_t first = 56;
};
template <> struct Versioned<kvt_block_info> {
  static constexpr const char *name = "kvt_block_info";
  static constexpr size_t first = 40;
};

template <> struct Versioned<kvt_connector_config> {
  static constexpr const char *name = "kvt_connector_config";
  static constexpr size_t first = 40;
};
template <> struct Versioned<kvt_connector_stats> {
  static constexpr const char *name = "kvt_connector_stats";
  static constexpr size_t first = 1024;
};
template <> struct Versioned<kvt_finished> {
  static constexpr const char *name = "kvt_finished";
  static constexpr size_t first = 72;
};
template <> struct Versioned<kvt_g4_stats> {  // 0.4.0
  static constexpr const char *name = "kvt_g4_stats";
  static constexpr size_t first = 96;
};
template <> struct Versioned<kvt_log_replay> {  // 0.4.0
  static constexpr const char *name = "kvt_log_replay";
  static constexpr size_t first = 1056;
};
template <> struct Versioned<kvt_connector_hooks> {  // 0.4.0
  static constexpr const char *name = "kvt_connector_hooks";
  static constexpr size_t first = 40;
};
template <> struct Versioned<kvt_pause_info> {  // 0.4.0
  static constexpr const char *name = "kvt_pause_info";
  static constexpr size_t first = 288;
};

template <> struct Versioned<kvt_endpoint_config> {  // 0.5.0
  static constexpr const char *name = "kvt_endpoint_config";
  static constexpr size_t first = 32;
};
template <> struct Versioned<kvt_endpoint_stats> {  // 0.5.0
  static constexpr const char *name = "kvt_endpoint_stats";
  static constexpr size_t first = 40;
};

// KVT_OK for a struct_size this library accepts, else KVT_ERR_INVALID_ARGUMENT with a
// message naming fn and the struct (what: "cfg", "out", ...).
template <class T>
kvt_status check_struct_size(const char *fn, const char *what, size_t size) noexcept {
  // No padding anywhere: every size in steps of alignof(T) then ends on a field boundary,
  // and a new field can never land in what an older size called padding. Append fields in
  // whole alignof(T) units (with an explicit reserved field where needed).
  static_assert(std::has_unique_object_representations_v<T>, "a versioned struct has padding");
  static_assert(sizeof(T) >= Versioned<T>::first && Versioned<T>::first % alignof(T) == 0);
  constexpr size_t lo = Versioned<T>::first, hi = sizeof(T), step = alignof(T);
  if (size >= lo && size <= hi && size % step == 0) return KVT_OK;
  return fail(KVT_ERR_INVALID_ARGUMENT,
              "%s: %s->struct_size is %zu, but this kvtier takes a %s of %zu to %zu bytes in "
              "steps of %zu: %s",
              fn, what, size, Versioned<T>::name, lo, hi, step,
              size > hi ? "the program was built against a newer kvtier.h than this library"
                        : "set it to the sizeof the program was built with");
}

// Reads the caller's struct in (of any accepted size) over *full, which holds the defaults.
template <class T>
kvt_status read_versioned(T *full, const T &in, const char *fn, const char *what) noexcept {
  if (kvt_status s = check_struct_size<T>(fn, what, in.struct_size); s != KVT_OK) return s;
  std::memcpy(static_cast<void *>(full), &in, in.struct_size);
  full->struct_size = sizeof(T);
  return KVT_OK;
}

// Writes full to the caller's struct up to its size, which check_struct_size accepted.
template <class T>
void write_versioned(T *out, T full) noexcept {
  full.struct_size = out->struct_size;
  std::memcpy(static_cast<void *>(out), &full, out->struct_size);
}

}  // namespace kvt
