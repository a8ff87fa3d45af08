#include "abi/xfer_table.hpp"

#include <atomic>

namespace kvt::abi {

uint64_t next_token() noexcept {
  // "kv" in the top bits; 2^45 tokens before the counter would reach them.
  static std::atomic<uint64_t> counter{1};
  return (uint64_t{0x6b76} << 48) | (counter.fetch_add(1, std::memory_order_relaxed) << 3);
}

// Never freed, like the tag pool: a manager destroyed during static destruction (a host's
// global object) still finds its tables.
TokenTable<Transfer> &transfers() {
  static auto *t = new TokenTable<Transfer>;
  return *t;
}

TokenTable<Fence> &fences() {
  static auto *t = new TokenTable<Fence>;
  return *t;
}

}  // namespace kvt::abi
