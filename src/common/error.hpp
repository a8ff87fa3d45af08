// Failure reporting shared by every layer: a status plus a thread-local message.
#pragma once

#include "kvtier.h"

namespace kvt {

// Records a printf-style message for kvt_last_error() and returns the status, so that a
// failure site reads `return fail(KVT_ERR_STATE, "...", ...);`.
[[gnu::format(printf, 2, 3)]] kvt_status fail(kvt_status s, const char *fmt, ...) noexcept;

const char *last_error() noexcept;

}  // namespace kvt
