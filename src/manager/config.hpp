// Defaults and validation of kvt_manager_config.
#pragma once

#include "kvtier.h"

namespace kvt {

void config_defaults(kvt_manager_config *cfg) noexcept;
// KVT_OK, or KVT_ERR_INVALID_ARGUMENT with a message naming the offending field. cfg and its
// g1_layout are full-size structs: the caller's have been read with read_versioned.
kvt_status config_validate(const kvt_manager_config &cfg) noexcept;

}  // namespace kvt
