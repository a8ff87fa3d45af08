#include "common/error.hpp"

#include <cstdarg>
#include <cstdio>

namespace kvt {
namespace {
// A fixed buffer: no allocation on the failure path and nothing to destroy at thread exit.
thread_local char g_message[512] = "no error";
}  // namespace

kvt_status fail(kvt_status s, const char *fmt, ...) noexcept {
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(g_message, sizeof g_message, fmt, ap);
  va_end(ap);
  return s;
}

const char *last_error() noexcept { return g_message; }

}  // namespace kvt
