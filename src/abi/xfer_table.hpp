// kvt_xfer * and kvt_fence * as the host sees them: tokens, never addresses. A process-wide
// table maps each token to the pipeline's object. Tokens come from one 64-bit counter and
// are never reused, so a stale, released-twice, forged or foreign value finds nothing and is
// refused with KVT_ERR_INVALID_HANDLE, however long the process runs. A call holds its own
// shared reference to the object while it runs, so a release on another thread (even of
// the transfer a call waits on) never frees it under that call.
#pragma once

#include <absl/container/flat_hash_map.h>

#include <cstdint>
#include <memory>
#include <mutex>

#include "pipeline/transfer.hpp"

namespace kvt::abi {

// The next token: never 0, never an address any process could map (the top bits make it
// non-canonical on 64-bit machines), pointer-aligned.
uint64_t next_token() noexcept;

template <class T>
class TokenTable {
 public:
  uint64_t insert(std::shared_ptr<T> obj, const Pipeline *owner) {
    uint64_t token = next_token();
    std::lock_guard lock(mu_);
    map_.emplace(token, Entry{std::move(obj), owner});
    return token;
  }
  std::shared_ptr<T> find(uint64_t token) const {
    std::lock_guard lock(mu_);
    auto it = map_.find(token);
    return it == map_.end() ? nullptr : it->second.obj;
  }
  // Removes the token; the object, if it was there.
  std::shared_ptr<T> take(uint64_t token) {
    std::lock_guard lock(mu_);
    auto it = map_.find(token);
    if (it == map_.end()) return nullptr;
    std::shared_ptr<T> obj = std::move(it->second.obj);
    map_.erase(it);
    return obj;
  }
  // Forgets every token of a pipeline that is going away.
  void drop(const Pipeline *owner) {
    std::lock_guard lock(mu_);
    absl::erase_if(map_, [&](const auto &kv) { return kv.second.owner == owner; });
  }

 private:
  struct Entry {
    std::shared_ptr<T> obj;
    const Pipeline *owner;
  };
  mutable std::mutex mu_;
  absl::flat_hash_map<uint64_t, Entry> map_;
};

TokenTable<Transfer> &transfers();
TokenTable<Fence> &fences();

inline uint64_t token(const void *p) { return uint64_t(reinterpret_cast<uintptr_t>(p)); }

// The fence behind a precondition argument of fn: null for none, or fails.
kvt_status precondition_of(const char *fn, kvt_fence *f, std::shared_ptr<Fence> *out);
// Names a built transfer of p, starts it and hands its token to *out.
kvt_status start(kvt_xfer **out, Pipeline &p, const std::shared_ptr<Transfer> &t,
                 const std::shared_ptr<Fence> &f);

// Called when a manager is destroyed: its transfers' and fences' tokens go stale.
inline void forget_tokens_of(const Pipeline *p) {
  transfers().drop(p);
  fences().drop(p);
}

}  // namespace kvt::abi
