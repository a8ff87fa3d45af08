// One shard's address, parsed from a G4 URL: redis://host[:port][/db] or unix:///path[?db=N].
#pragma once

#include <string>
#include <string_view>

#include "kvtier.h"

namespace kvt::remote {

struct Endpoint {
  std::string host;  // TCP: a name, an IPv4 address or an IPv6 one (without brackets)
  int port = 0;      // TCP only
  std::string path;  // Unix socket: absolute; empty for TCP
  int db = 0;        // SELECTed after connecting when not 0

  bool is_unix() const { return !path.empty(); }
  // A canonical name: the same shard always gets the same one, whatever the spelling of its
  // URL (default port, /0). Consistent hashing places keys by it.
  std::string name() const;
};

// Parses one URL; errors are KVT_ERR_INVALID_ARGUMENT naming g4_url and what is wrong.
kvt_status parse_endpoint(Endpoint *out, std::string_view url);

}  // namespace kvt::remote
