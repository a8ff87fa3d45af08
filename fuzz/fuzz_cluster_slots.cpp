// fuzz_cluster_slots: G4's reader of a Redis Cluster's slot map (src/remote/slot_map.cpp,
// compiled in) on bytes as a cluster node, or anything posing as one, could answer to
// CLUSTER SLOTS; and its reader of MOVED/ASK redirections on the same bytes as an error's
// words. The input is the size of the cuts the source makes (1 byte), then the stream. A
// refusal must be KVT_ERR_IO with a message; an accepted map must route every slot to one of
// at most 1024 masters, each a valid endpoint, or to none.
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "common/error.hpp"
#include "chunked_source.hpp"
#include "remote/reply_reader.hpp"
#include "remote/slot_map.hpp"

namespace {

void check(bool ok, const char *what) {
  if (ok) return;
  std::fprintf(stderr, "fuzz_cluster_slots: %s (%s)\n", what, kvt::last_error());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  kvt::remote::Endpoint asked;
  asked.host = "127.0.0.1";
  asked.port = 7000;
  const std::string_view text(reinterpret_cast<const char *>(data + 1), size - 1);
  kvt::remote::Redirect d;
  if (kvt::remote::parse_redirect(&d, text, asked)) {
    check(d.slot < kvt::remote::kSlots, "a redirection to a slot out of range");
    check(!d.to.host.empty() && d.to.port > 0 && d.to.port <= 65535, "a redirection nowhere");
  }
  kvt_fuzz::ChunkedSource src(data + 1, size - 1, data[0] == 0 ? size : data[0]);
  kvt::remote::ReplyReader reader(src);
  kvt::remote::SlotMap map;
  kvt_status s = kvt::remote::read_slot_map(&map, reader, asked);
  if (s != KVT_OK) {
    check(s == KVT_ERR_IO, "a refusal that is not KVT_ERR_IO");
    check(kvt::last_error()[0] != '\0', "a refusal without a message");
    return 0;
  }
  check(map.nodes.size() <= kvt::remote::kMaxNodes, "more masters than the limit");
  for (const kvt::remote::Endpoint &e : map.nodes)
    check(!e.host.empty() && e.port > 0 && e.port <= 65535, "a master that is no address");
  for (uint16_t o : map.owner)
    check(o == kvt::remote::kNoNode || o < map.nodes.size(), "a slot routed to no master");
  return 0;
}
