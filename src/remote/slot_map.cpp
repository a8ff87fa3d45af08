#include "remote/slot_map.hpp"

#include <charconv>
#include <string>
#include <unordered_map>

#include "common/error.hpp"

namespace kvt::remote {
namespace {

// CRC16-CCITT (XMODEM: polynomial 0x1021, initial 0), as Redis Cluster's keyHashSlot.
constexpr std::array<uint16_t, 256> crc_table() {
  std::array<uint16_t, 256> t{};
  for (unsigned i = 0; i < 256; ++i) {
    uint16_t c = uint16_t(i << 8);
    for (int b = 0; b < 8; ++b) c = uint16_t(c & 0x8000 ? (c << 1) ^ 0x1021 : c << 1);
    t[i] = c;
  }
  return t;
}
constexpr std::array<uint16_t, 256> kCrc = crc_table();

uint16_t crc16(std::string_view s) noexcept {
  uint16_t c = 0;
  for (unsigned char b : s) c = uint16_t((c << 8) ^ kCrc[((c >> 8) ^ b) & 0xff]);
  return c;
}

constexpr int kMaxDepth = 4;  // the reply, a range, a node, a node's metadata

kvt_status bad_map(const Endpoint &from, const char *why) {
  return fail(KVT_ERR_IO, "G4: CLUSTER SLOTS from %s: %s", from.name().c_str(), why);
}

// An address and a port as a node's endpoint, checked as a URL's are.
bool node_endpoint(Endpoint *out, std::string_view host, int64_t port, const Endpoint &asked) {
  if (host.empty() || host == "?") host = asked.host;
  if (port < 1 || port > 65535) return false;
  const bool v6 = host.find(':') != std::string_view::npos;
  std::string url = "redis://";
  url += v6 ? "[" + std::string(host) + "]" : std::string(host);
  url += ":" + std::to_string(port);
  return parse_endpoint(out, url) == KVT_OK;  // the caller words the failure
}

class MapReader {
 public:
  MapReader(ReplyReader &r, const Endpoint &asked) : r_(r), asked_(asked) {}

  kvt_status read(SlotMap *out) {
    out->nodes.clear();
    out->owner.fill(kNoNode);
    Reply top;
    if (kvt_status s = r_.next_element(&top); s != KVT_OK) return s;
    if (top.kind == Reply::Kind::kError)
      return fail(KVT_ERR_IO, "G4: %s refused CLUSTER SLOTS: %s", asked_.name().c_str(),
                  top.text.c_str());
    if (top.kind != Reply::Kind::kArray || top.integer < 0)
      return bad_map(asked_, "not an array of slot ranges");
    for (int64_t i = 0; i < top.integer; ++i)
      if (kvt_status s = range(out); s != KVT_OK) return s;
    return KVT_OK;
  }

 private:
  // [start, end, master, replica...]
  kvt_status range(SlotMap *out) {
    Reply h, a, b;
    if (kvt_status s = r_.next_element(&h); s != KVT_OK) return s;
    if (h.kind != Reply::Kind::kArray || h.integer < 3)
      return bad_map(asked_, "a slot range that is not [start, end, master, ...]");
    if (kvt_status s = r_.next_element(&a); s != KVT_OK) return s;
    if (kvt_status s = r_.next_element(&b); s != KVT_OK) return s;
    if (a.kind != Reply::Kind::kInteger || b.kind != Reply::Kind::kInteger || a.integer < 0 ||
        a.integer > b.integer || b.integer >= int64_t(kSlots))
      return bad_map(asked_, "a slot range outside 0..16383 or out of order");
    uint16_t node = kNoNode;
    if (kvt_status s = master(out, &node); s != KVT_OK) return s;
    for (int64_t slot = a.integer; slot <= b.integer; ++slot) out->owner[size_t(slot)] = node;
    for (int64_t i = 3; i < h.integer; ++i)  // replicas: kvtier reads and writes masters
      if (kvt_status s = skip(2); s != KVT_OK) return s;
    return KVT_OK;
  }

  // [host, port, id?, metadata?]
  kvt_status master(SlotMap *out, uint16_t *node) {
    Reply h, host, port;
    if (kvt_status s = r_.next_element(&h); s != KVT_OK) return s;
    if (h.kind != Reply::Kind::kArray || h.integer < 2)
      return bad_map(asked_, "a master that is not [address, port, ...]");
    if (kvt_status s = r_.next_element(&host); s != KVT_OK) return s;
    if (kvt_status s = r_.next_element(&port); s != KVT_OK) return s;
    Endpoint e;
    if (host.kind != Reply::Kind::kBulk || host.text.size() != host.length ||
        port.kind != Reply::Kind::kInteger || !node_endpoint(&e, host.text, port.integer, asked_))
      return bad_map(asked_, "a master whose address or port is not one");
    for (int64_t i = 2; i < h.integer; ++i)
      if (kvt_status s = skip(3); s != KVT_OK) return s;
    const std::string name = e.name();
    auto [at, added] = index_.emplace(name, uint16_t(out->nodes.size()));
    if (added) {
      if (out->nodes.size() == kMaxNodes) return bad_map(asked_, "more than 1024 masters");
      out->nodes.push_back(std::move(e));
    }
    *node = at->second;
    return KVT_OK;
  }

  // Reads past one element at `depth`, an array's elements included.
  kvt_status skip(int depth) {
    Reply x;
    if (kvt_status s = r_.next_element(&x); s != KVT_OK) return s;
    if (x.kind != Reply::Kind::kArray) return KVT_OK;
    if (depth >= kMaxDepth) return bad_map(asked_, "arrays nested deeper than a node's");
    for (int64_t i = 0; i < x.integer; ++i)
      if (kvt_status s = skip(depth + 1); s != KVT_OK) return s;
    return KVT_OK;
  }

  ReplyReader &r_;
  const Endpoint &asked_;
  std::unordered_map<std::string, uint16_t> index_;
};

}  // namespace

uint16_t key_slot(std::string_view key) noexcept {
  if (size_t open = key.find('{'); open != std::string_view::npos) {
    size_t close = key.find('}', open + 1);
    if (close != std::string_view::npos && close > open + 1)
      key = key.substr(open + 1, close - open - 1);
  }
  return uint16_t(crc16(key) & (kSlots - 1));
}

kvt_status read_slot_map(SlotMap *out, ReplyReader &r, const Endpoint &asked) {
  return MapReader(r, asked).read(out);
}

bool parse_redirect(Redirect *out, std::string_view error, const Endpoint &from) {
  if (error.substr(0, 6) == "MOVED ") {
    out->ask = false;
    error.remove_prefix(6);
  } else if (error.substr(0, 4) == "ASK ") {
    out->ask = true;
    error.remove_prefix(4);
  } else {
    return false;
  }
  const size_t space = error.find(' ');
  if (space == std::string_view::npos) return false;
  unsigned slot = 0;
  auto [end, ec] = std::from_chars(error.data(), error.data() + space, slot);
  if (ec != std::errc() || end != error.data() + space || slot >= kSlots) return false;
  const std::string_view addr = error.substr(space + 1);
  const size_t colon = addr.rfind(':');
  if (colon == std::string_view::npos) return false;
  int64_t port = 0;
  auto [pend, pec] = std::from_chars(addr.data() + colon + 1, addr.data() + addr.size(), port);
  if (pec != std::errc() || pend != addr.data() + addr.size()) return false;
  std::string_view host = addr.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  out->slot = uint16_t(slot);
  return node_endpoint(&out->to, host, port, from);
}

}  // namespace kvt::remote
