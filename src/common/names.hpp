// The names of the header's codes, for messages, metrics and logs at every floor (the C calls
// kvt_status_str and kvt_slot_state_str return these).
#pragma once

#include <cstdint>

#include "kvtier.h"

namespace kvt {

const char *status_name(kvt_status s) noexcept;      // "KVT_ERR_STATE"; unknown: KVT_UNKNOWN_STATUS
const char *slot_state_name(uint32_t s) noexcept;    // "KVT_SLOT_DECODING"; unknown: KVT_SLOT_UNKNOWN

}  // namespace kvt
