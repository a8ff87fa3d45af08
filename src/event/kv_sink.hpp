// Where a tier sends what the KV-event publisher (kv_events/) needs: the events it produced
// and the tokens of the blocks it registered from tokens. An interface down here, so that
// block/ never includes kv_events/; a tier without a sink pays one branch per operation.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kvtier.h"

namespace kvt {

class KvSink {
 public:
  // The tokens of n full blocks: tokens[i * page_size ..] belong to seq_hashes[i].
  virtual void note_tokens(const uint64_t *seq_hashes, size_t n,
                           const uint32_t *tokens) noexcept = 0;
  // Events in the order of the changes they describe; called under the tier's lock, so it
  // must not wait for anything but its own short lock.
  virtual void publish(const kvt_event *events, size_t n) noexcept = 0;

 protected:
  ~KvSink() = default;
};

}  // namespace kvt
