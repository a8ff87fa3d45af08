// The structs behind the opaque C handles. A magic number in front tells a live object of
// the right type from a foreign pointer (a kvt_seq passed as a manager, say). Transfers and
// fences are not pointers at all but tokens, looked up in abi/xfer_table.hpp.
#pragma once

#include <cstdint>
#include <memory>

#include "abi/guard.hpp"
#include "common/error.hpp"
#include "hash/token_seq.hpp"
#include "kvtier.h"
#include "manager/manager.hpp"

struct kvt_manager {
  static constexpr uint64_t kMagic = 0x6b76746d616e6167;  // "kvtmanag"
  uint64_t magic = kMagic;
  std::unique_ptr<kvt::Manager> impl;
};

struct kvt_seq {
  static constexpr uint64_t kMagic = 0x6b7674746f6b7371;  // "kvttoksq"
  uint64_t magic = kMagic;
  kvt::TokenSeq impl;
};

namespace kvt::abi {

kvt_status bad_object(const char *fn, const void *p, const char *type) noexcept;

// The object behind a C handle, or nullptr with *st set (NULL, or not a live object).
inline Manager *manager(const char *fn, kvt_manager *m, kvt_status *st) noexcept {
  if (m == nullptr || m->magic != kvt_manager::kMagic) {
    *st = bad_object(fn, m, "manager");
    return nullptr;
  }
  *st = KVT_OK;
  return m->impl.get();
}

// The body of most entry points: inside guard(), op runs on the live manager behind m, or
// the call fails with the status that says why m is not one.
template <class Op>
kvt_status on_manager(const char *fn, kvt_manager *m, Op &&op) noexcept {
  return guard(fn, [&] {
    kvt_status st;
    Manager *mgr = manager(fn, m, &st);
    return mgr ? op(*mgr) : st;
  });
}

template <class Seq>  // kvt_seq or const kvt_seq
auto *token_seq(const char *fn, Seq *s, kvt_status *st) noexcept {
  if (s == nullptr || s->magic != kvt_seq::kMagic) {
    *st = bad_object(fn, s, "sequence");
    return decltype(&s->impl)(nullptr);
  }
  *st = KVT_OK;
  return &s->impl;
}

}  // namespace kvt::abi
