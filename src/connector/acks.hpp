// What the workers' reports said of one of the scheduler half's batches: it ends once every
// rank named it, and a copy failed if it failed on any rank (its shard is missing).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "connector/metadata.hpp"
#include "kvtier.h"

namespace kvt::conn {

struct Acks {
  std::vector<bool> by;            // per rank: its report named the batch
  uint32_t count = 0;
  std::vector<kvt_status> failed;  // per copy: the first failure reported, or KVT_OK
  bool any_failed = false;

  // Counts rank r.rank's Done d for a batch of `ops` copies among `world` ranks; true when
  // it was the last rank's. *fresh: the copies whose failure this report is the first to tell.
  bool add(const Report &r, const Done &d, size_t ops, uint32_t world,
           std::vector<uint32_t> *fresh) {
    if (by.empty()) {
      by.resize(world);
      failed.assign(ops, KVT_OK);
    }
    by[r.rank] = true;
    ++count;
    fresh->clear();
    for (const Failure &f : d.failed) {
      if (failed[f.op] != KVT_OK) continue;
      failed[f.op] = f.status;
      any_failed = true;
      fresh->push_back(f.op);
    }
    return count == world;
  }
};

}  // namespace kvt::conn
