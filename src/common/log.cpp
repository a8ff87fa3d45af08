#include "common/log.hpp"

#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <mutex>

namespace kvt {
namespace {
std::atomic<int> g_level{KVT_LOG_OFF};
std::mutex g_mu;  // callback and user_data change together
kvt_log_fn g_fn = nullptr;
void *g_user = nullptr;
}  // namespace

void set_log_callback(int level, kvt_log_fn fn, void *user_data) noexcept {
  std::lock_guard lock(g_mu);
  g_fn = fn;
  g_user = user_data;
  g_level.store(fn ? level : KVT_LOG_OFF, std::memory_order_relaxed);
}

void log(int level, const char *fmt, ...) noexcept {
  if (level <= KVT_LOG_OFF || level > g_level.load(std::memory_order_relaxed)) return;
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  std::lock_guard lock(g_mu);
  if (g_fn != nullptr && level <= g_level.load(std::memory_order_relaxed)) g_fn(level, buf, g_user);
}

}  // namespace kvt
