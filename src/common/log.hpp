// Diagnostics for a person, through the host's kvt_log_set_callback; off by default.
#pragma once

#include "kvtier.h"

namespace kvt {

// Formats and hands one message to the host's callback when its level is enabled. Cheap
// when logging is off: one relaxed atomic load.
[[gnu::format(printf, 2, 3)]] void log(int level, const char *fmt, ...) noexcept;

void set_log_callback(int level, kvt_log_fn fn, void *user_data) noexcept;

}  // namespace kvt
