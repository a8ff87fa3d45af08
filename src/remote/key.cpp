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
  k.reserve(prefix.size() + 51);
  k += prefix;
  k += ':';
  hex16(k, ns);
  k += ':';
  hex16(k, layout);
  k += ':';
  hex16(k, hash);
  return k;
}

}  // namespace kvt::remote
