// What a run leaves in each tier's registry, for checking KV-event subscribers against it
// (--dump-registry), and the trace split across processes that a router test needs
// (--shard).
#pragma once

#include <cstdint>
#include <string>

#include "kvtier.h"
#include "options.hpp"
#include "trace.hpp"

namespace kvt::replay {

// Writes {"G1": [...], "G2": [...], "G3": [...]} to path: the sequence hashes each present
// tier holds (kvt_tier_hashes), sorted: with --g3-keep, G3's include those an earlier run
// left. The file appears whole (written aside, then renamed). False with *error on failure.
bool dump_registry(kvt_manager *m, const Options &o, const std::string &path,
                   std::string *error);

// Keeps the requests of conversation shard `index` of `count`: a request's conversation is
// its second block id (the first after a prompt that every request shares), or its first
// when it has one. The requests left keep their order.
void keep_shard(Trace *t, uint32_t index, uint32_t count);

}  // namespace kvt::replay
