#include "block/tag_pool.hpp"

#include <mutex>
#include <type_traits>

#include "block/handle.hpp"
#include "common/error.hpp"

namespace kvt {

namespace {
// A FIFO ring of the free tags. Constant-initialised and trivially destructible, so that a
// manager destroyed during static destruction still finds it.
struct Pool {
  std::mutex mu;
  uint8_t ring[handle::kTags];
  uint32_t head = 0, count = handle::kTags;
  constexpr Pool() : ring{} {
    for (uint32_t i = 0; i < handle::kTags; ++i) ring[i] = uint8_t(i);
  }
};
constinit Pool g_pool;
static_assert(std::is_trivially_destructible_v<Pool>);
}  // namespace

kvt_status TagLease::acquire() noexcept {
  std::lock_guard lock(g_pool.mu);
  if (g_pool.count == 0)
    return fail(KVT_ERR_NO_SPACE,
                "%u managers are alive, the most one process may hold: destroy one first",
                handle::kTags);
  tag_ = g_pool.ring[g_pool.head];
  g_pool.head = (g_pool.head + 1) % handle::kTags;
  --g_pool.count;
  return KVT_OK;
}

TagLease::~TagLease() {
  if (tag_ == kNone) return;
  std::lock_guard lock(g_pool.mu);
  g_pool.ring[(g_pool.head + g_pool.count) % handle::kTags] = uint8_t(tag_);
  ++g_pool.count;
}

}  // namespace kvt
