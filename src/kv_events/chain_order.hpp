// A snapshot's blocks in an order that vLLM's BlockStored can say in few events: each block
// right after its parent where it can be (a chain in a row is one event), every parent
// before its children.
#pragma once

#include <cstddef>

#include "kv_events/batch_encoder.hpp"

namespace kvt::pub {

// Reorders the n events of one tier in place: a depth-first walk of their hash forest,
// from the blocks whose parent is not among them, siblings in their given order.
void order_chains(QueuedEvent *events, size_t n);

}  // namespace kvt::pub
