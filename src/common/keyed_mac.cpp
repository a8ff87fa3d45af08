#include "common/keyed_mac.hpp"

#include <sodium.h>

#include <cstdlib>
#include <cstring>

#include "common/error.hpp"

namespace kvt {

kvt_status read_mac_key(MacKey *out, const char *field, const char *env) {
  const char *hex = std::getenv(env);
  if (hex == nullptr)
    return fail(KVT_ERR_INVALID_ARGUMENT,
                "%s names the environment variable \"%s\", which is not set", field, env);
  MacKey key;
  size_t n = 0;
  if (std::strlen(hex) != 2 * key.size() ||
      sodium_hex2bin(key.data(), key.size(), hex, 2 * key.size(), nullptr, &n, nullptr) != 0 ||
      n != key.size())
    return fail(KVT_ERR_INVALID_ARGUMENT,
                "%s: the environment variable \"%s\" must hold 64 hex digits (a 32-byte key); "
                "its %zu characters are not that", field, env, std::strlen(hex));
  *out = key;
  sodium_memzero(key.data(), key.size());
  return KVT_OK;
}

void keyed_mac(uint8_t out[kMacBytes], const uint8_t *key, std::initializer_list<Bytes> parts) {
  [[maybe_unused]] static const int ready = sodium_init();  // once; picks the fastest code
  crypto_generichash_state st;
  crypto_generichash_init(&st, key, kMacKeyBytes, kMacBytes);
  for (const Bytes &p : parts)
    crypto_generichash_update(&st, static_cast<const uint8_t *>(p.data), p.len);
  crypto_generichash_final(&st, out, kMacBytes);
}

bool mac_equal(const uint8_t a[kMacBytes], const uint8_t b[kMacBytes]) noexcept {
  return sodium_memcmp(a, b, kMacBytes) == 0;
}

}  // namespace kvt
