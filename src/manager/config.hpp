// Defaults and validation of kvt_manager_config, and its translation into the settings of
// each part the manager builds, which keeps those and not the C struct.
#pragma once

#include <cstdint>

#include "copy/disk_engine.hpp"
#include "kvtier.h"
#include "pipeline/config.hpp"
#include "remote/store.hpp"

namespace kvt {

void config_defaults(kvt_manager_config *cfg) noexcept;
// KVT_OK, or KVT_ERR_INVALID_ARGUMENT with a message naming the offending field. cfg and its
// g1_layout are full-size structs: the caller's have been read with read_versioned.
kvt_status config_validate(const kvt_manager_config &cfg) noexcept;

// The id of the block layout (page_size, num_layers, num_outer, chunk_bytes) that G4's values
// carry, so that managers of other layouts never read each other's values.
uint64_t g4_layout(const kvt_manager_config &cfg) noexcept;
// G4's client config from cfg (g4_url set): KVT_ERR_INVALID_ARGUMENT naming the field.
kvt_status g4_config(remote::Config *out, const kvt_manager_config &cfg);
PipelineConfig pipeline_config(const kvt_manager_config &cfg) noexcept;
DiskConfig disk_config(const kvt_manager_config &cfg) noexcept;  // G3 (g3_blocks > 0)

}  // namespace kvt
