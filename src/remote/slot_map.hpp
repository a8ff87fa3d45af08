// Redis Cluster's key space: 16384 slots, a key's slot the CRC16 of its hash tag (the part
// between the first '{' and the next '}', when not empty) or of the whole key. A slot map says
// which master serves each slot; it is read from CLUSTER SLOTS, and a MOVED or ASK error
// names the node that serves one slot now. Both come from a server, so both are checked.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "kvtier.h"
#include "remote/endpoint.hpp"
#include "remote/reply_reader.hpp"

namespace kvt::remote {

inline constexpr size_t kSlots = 16384;
// Masters a map may name: beyond any real cluster (Redis advises at most 1000 nodes).
inline constexpr size_t kMaxNodes = 1024;
inline constexpr uint16_t kNoNode = 0xffff;

uint16_t key_slot(std::string_view key) noexcept;

struct SlotMap {
  std::vector<Endpoint> nodes;         // the masters, each once
  std::array<uint16_t, kSlots> owner;  // an index into nodes, or kNoNode: a slot nobody serves
};

// Reads one CLUSTER SLOTS reply from r into *out. `asked` is the node it came from: its host
// stands for a master whose address is empty or "?" (a node that does not know its own).
// KVT_ERR_IO with a message when the reply is an error (not a cluster node, a cluster that
// is down) or not the shape CLUSTER SLOTS has: a range out of order or outside 0..16383, a
// node that is not an address and a port, more than kMaxNodes masters, arrays deeper than a
// node's. Replicas and the fields after a master's port are read past.
kvt_status read_slot_map(SlotMap *out, ReplyReader &r, const Endpoint &asked);

// A redirection: "MOVED <slot> <host>:<port>" or "ASK <slot> <host>:<port>" (an error reply's
// words, from the node `from`, whose host stands for an empty one), checked as a URL is.
// False for any other error, and for a redirection that is malformed.
struct Redirect {
  bool ask = false;  // ASK: this one command goes to `to`, after ASKING; the map stands
  uint16_t slot = 0;
  Endpoint to;
};
bool parse_redirect(Redirect *out, std::string_view error, const Endpoint &from);

}  // namespace kvt::remote
