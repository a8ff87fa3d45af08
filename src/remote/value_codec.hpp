// G4's values: a 64-byte header, then the block's bytes. All integers little-endian.
//
//   offset size  field
//        0    4  magic "KVG4"
//        4    2  version (1)
//        6    2  header length (64)
//        8    8  sequence hash            these four must equal what the reader
//       16    8  parent sequence hash     expects
//       24    8  namespace (g4_namespace)
//       32    8  layout id
//       40    8  payload length (the block's bytes)
//       48    8  XXH3-64 of the payload
//       56    8  XXH3-64 of bytes 0..56 of the header
//
// Keyed (g4_key_env: a namespace's 32-byte key), the version is 2 and bytes 48..64 hold a
// keyed BLAKE2b-128 (libsodium's crypto_generichash) of header bytes 0..48 and the payload
// instead: a client without the key cannot write a value that a keyed reader takes, and a
// value is bound to its block, chain, namespace and layout. Keyed readers refuse version 1,
// unkeyed ones version 2.
//
// A reader checks every field before it copies a byte: a value that fails is never data.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kvtier.h"

namespace kvt::remote {

constexpr size_t kHeaderBytes = 64;
constexpr uint16_t kValueVersion = 1, kKeyedValueVersion = 2;
constexpr size_t kValueKeyBytes = 32;  // kMacKeyBytes (common/keyed_mac)

// What a value claims to be, and what a reader expects it to be.
struct ValueId {
  uint64_t hash, parent, ns, layout;
};

// key: kValueKeyBytes, or null for unkeyed values.
// Writes the header of a value holding payload[0..len).
void encode_header(uint8_t out[kHeaderBytes], const ValueId &id, const void *payload,
                   size_t len, const uint8_t *key) noexcept;

// Checks value[0..n) against want and a payload of payload_len bytes; on KVT_OK *payload
// points into value. Anything else is KVT_ERR_CORRUPT, with a message (kvt_last_error) that
// names the first field that is wrong.
kvt_status decode_value(const void *value, size_t n, const ValueId &want, size_t payload_len,
                        const uint8_t **payload, const uint8_t *key) noexcept;

// The same checks for a value read in two parts, its header and then its payload of
// payload_len bytes (as the reply reader places a value of the expected size).
kvt_status check_value(const uint8_t header[kHeaderBytes], const void *payload,
                       size_t payload_len, const ValueId &want, const uint8_t *key) noexcept;

}  // namespace kvt::remote
