// Helpers for the C ABI shim: every entry point runs inside guard(), so that no C++
// exception crosses the boundary, and checks its pointer arguments with the helpers below.
#pragma once

#include <cstring>
#include <exception>
#include <new>

#include "common/error.hpp"
#include "kvtier.h"

namespace kvt::abi {

template <class F>
kvt_status guard(const char *fn, F &&body) noexcept {
  try {
    return body();
  } catch (const std::bad_alloc &) {
    return fail(KVT_ERR_NO_MEMORY, "%s: out of memory", fn);
  } catch (const std::exception &e) {
    return fail(KVT_ERR_INTERNAL, "%s: %s", fn, e.what());
  } catch (...) {
    return fail(KVT_ERR_INTERNAL, "%s: unknown exception", fn);
  }
}

inline kvt_status null_arg(const char *fn, const char *name) noexcept {
  return fail(KVT_ERR_INVALID_ARGUMENT, "%s: %s must not be NULL", fn, name);
}

// Arrays of n elements: NULL only when empty, and n no larger than memory can hold.
template <class T>
kvt_status check_array(const char *fn, const char *name, const T *p, size_t n) noexcept {
  if (n > (size_t{1} << 48) / sizeof(T))
    return fail(KVT_ERR_INVALID_ARGUMENT, "%s: count %zu for %s is absurd", fn, n, name);
  if (p == nullptr && n > 0)
    return fail(KVT_ERR_INVALID_ARGUMENT, "%s: %s is NULL but the count is %zu", fn, name, n);
  return KVT_OK;
}

// A kvt_tier from a C caller may hold any int; loading an out-of-range enum is undefined in
// C++, so read its bytes instead.
inline int tier_number(const kvt_tier &t) noexcept {
  int n;
  static_assert(sizeof n == sizeof t);
  std::memcpy(&n, &t, sizeof n);
  return n;
}

}  // namespace kvt::abi
