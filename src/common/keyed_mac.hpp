// Keyed MACs for what kvtier stores where others can write (G4's values in a shared Redis,
// G3's slots on a shared filesystem): a 32-byte key that the host supplies in an environment
// variable the config names, and BLAKE2b-128 (libsodium's crypto_generichash) keyed with it.
// Without the key, nobody can make bytes that a keyed reader takes.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "kvtier.h"

namespace kvt {

inline constexpr size_t kMacKeyBytes = 32, kMacBytes = 16;
using MacKey = std::array<uint8_t, kMacKeyBytes>;

// Reads the key from the environment variable `env`, which the config field `field` names:
// 64 hex digits. KVT_ERR_INVALID_ARGUMENT naming the field and the variable, never showing
// its content, when it is unset or not a key.
kvt_status read_mac_key(MacKey *out, const char *field, const char *env);

// The MAC of the parts, in order, under key (kMacKeyBytes).
struct Bytes {
  const void *data;
  size_t len;
};
void keyed_mac(uint8_t out[kMacBytes], const uint8_t *key, std::initializer_list<Bytes> parts);

// In constant time.
bool mac_equal(const uint8_t a[kMacBytes], const uint8_t b[kMacBytes]) noexcept;

}  // namespace kvt
