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
// A reader checks every field before it copies a byte: a value that fails is never data.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kvtier.h"

namespace kvt::remote {

constexpr size_t kHeaderBytes = 64;
constexpr uint16_t kValueVersion = 1;

// What a value claims to be, and what a reader expects it to be.
struct ValueId {
  uint64_t hash, parent, ns, layout;
};

// Writes the header of a value holding payload[0..len).
void encode_header(uint8_t out[kHeaderBytes], const ValueId &id, const void *payload,
                   size_t len) noexcept;

// Checks value[0..n) against want and a payload of payload_len bytes; on KVT_OK *payload
// points into value. Anything else is KVT_ERR_CORRUPT, with a message (kvt_last_error) that
// names the first field that is wrong.
kvt_status decode_value(const void *value, size_t n, const ValueId &want, size_t payload_len,
                        const uint8_t **payload) noexcept;

// The same checks for a value read in two parts, its header and then its payload of
// payload_len bytes (as the reply reader places a value of the expected size).
kvt_status check_value(const uint8_t header[kHeaderBytes], const void *payload,
                       size_t payload_len, const ValueId &want) noexcept;

}  // namespace kvt::remote
