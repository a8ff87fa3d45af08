#include "remote/key.hpp"

namespace kvt::remote {
namespace {
void hex16(std::string &out, uint64_t v) {
  static constexpr char kDigits[] = "0123456789abcdef";
  char buf[16];
  for (int i = 15; i >= 0; --i, v >>= 4) buf[i] = kDigits[v & 15];
  out.append(buf, 16);
}
}  // namespace

std::string KeySpace::key(uint64_t hash) const {
  std::string k;
  k.reserve(prefix.size() + 53);
  k += prefix;
  k += ':';
  hex16(k, ns);
  k += ':';
  hex16(k, layout);
  k += tagged ? ":{" : ":";
  hex16(k, hash);
  if (tagged) k += '}';
  return k;
}

}  // namespace kvt::remote
