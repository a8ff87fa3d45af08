#include "remote/value_codec.hpp"

#include <xxhash.h>

#include <cstring>

#include "common/error.hpp"
#include "common/keyed_mac.hpp"
#include "hash/xxh3_wide.hpp"

namespace kvt::remote {
namespace {

constexpr uint8_t kMagic[4] = {'K', 'V', 'G', '4'};
constexpr size_t kHeaderSumAt = 56;

void put16(uint8_t *p, uint16_t v) {
  for (int i = 0; i < 2; ++i) p[i] = uint8_t(v >> (8 * i));
}
void put64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = uint8_t(v >> (8 * i));
}
uint16_t get16(const uint8_t *p) { return uint16_t(p[0] | (p[1] << 8)); }
uint64_t get64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

using ull = unsigned long long;

kvt_status mismatch(const char *field, uint64_t got, uint64_t want) {
  return fail(KVT_ERR_CORRUPT, "G4 value: %s is 0x%llx, expected 0x%llx", field, ull(got),
              ull(want));
}

constexpr size_t kMacAt = 48;

// The keyed BLAKE2b-128 of header bytes 0..48 and the payload.
void mac(uint8_t out[kMacBytes], const uint8_t *header, const void *payload, size_t len,
         const uint8_t *key) {
  keyed_mac(out, key, {{header, kMacAt}, {payload, len}});
}

// Every field of the header but what covers the payload (its checksum, or the MAC).
kvt_status check_header(const uint8_t *p, const ValueId &want, size_t payload_len,
                        const uint8_t *key) {
  if (std::memcmp(p, kMagic, 4) != 0)
    return fail(KVT_ERR_CORRUPT, "G4 value: no KVG4 magic (not written by kvtier)");
  if (const uint16_t v = get16(p + 4); v != (key ? kKeyedValueVersion : kValueVersion)) {
    if (v == kValueVersion)
      return fail(KVT_ERR_CORRUPT, "G4 value: written without a key, and this namespace's "
                                   "values are keyed (g4_key_env)");
    if (v == kKeyedValueVersion)
      return fail(KVT_ERR_CORRUPT, "G4 value: written with a key, and this manager has none "
                                   "(g4_key_env)");
    return mismatch("version", v, key ? kKeyedValueVersion : kValueVersion);
  }
  if (get16(p + 6) != kHeaderBytes) return mismatch("header length", get16(p + 6), kHeaderBytes);
  if (!key)  // keyed, the MAC covers the header
    if (uint64_t sum = XXH3_64bits(p, kHeaderSumAt); get64(p + kHeaderSumAt) != sum)
      return mismatch("the header's checksum", get64(p + kHeaderSumAt), sum);
  if (get64(p + 8) != want.hash) return mismatch("the sequence hash", get64(p + 8), want.hash);
  if (get64(p + 16) != want.parent)
    return mismatch("the parent hash", get64(p + 16), want.parent);
  if (get64(p + 24) != want.ns) return mismatch("the namespace", get64(p + 24), want.ns);
  if (get64(p + 32) != want.layout) return mismatch("the layout", get64(p + 32), want.layout);
  if (get64(p + 40) != payload_len)
    return mismatch("the payload length", get64(p + 40), payload_len);
  return KVT_OK;
}

kvt_status check_payload(const uint8_t *header, const void *payload, size_t len,
                         const uint8_t *key) {
  if (key) {
    uint8_t want[kMacBytes];
    mac(want, header, payload, len, key);
    if (!mac_equal(want, header + kMacAt))
      return fail(KVT_ERR_CORRUPT, "G4 value: its MAC does not match: written without this "
                                   "namespace's key (g4_key_env), or altered");
    return KVT_OK;
  }
  if (uint64_t sum = xxh3().plain(payload, len); get64(header + 48) != sum)
    return mismatch("the payload's checksum", get64(header + 48), sum);
  return KVT_OK;
}

}  // namespace

void encode_header(uint8_t out[kHeaderBytes], const ValueId &id, const void *payload,
                   size_t len, const uint8_t *key) noexcept {
  std::memcpy(out, kMagic, 4);
  put16(out + 4, key ? kKeyedValueVersion : kValueVersion);
  put16(out + 6, uint16_t(kHeaderBytes));
  put64(out + 8, id.hash);
  put64(out + 16, id.parent);
  put64(out + 24, id.ns);
  put64(out + 32, id.layout);
  put64(out + 40, len);
  if (key) {
    mac(out + kMacAt, out, payload, len, key);
    return;
  }
  put64(out + 48, xxh3().plain(payload, len));
  put64(out + kHeaderSumAt, XXH3_64bits(out, kHeaderSumAt));
}

kvt_status decode_value(const void *value, size_t n, const ValueId &want, size_t payload_len,
                        const uint8_t **payload, const uint8_t *key) noexcept {
  const auto *p = static_cast<const uint8_t *>(value);
  if (n < kHeaderBytes)
    return fail(KVT_ERR_CORRUPT, "G4 value: %zu bytes, shorter than its %zu-byte header", n,
                kHeaderBytes);
  if (kvt_status s = check_header(p, want, payload_len, key); s != KVT_OK) return s;
  if (n - kHeaderBytes != payload_len)
    return fail(KVT_ERR_CORRUPT, "G4 value: %zu bytes after the header, which says %zu",
                n - kHeaderBytes, payload_len);
  if (kvt_status s = check_payload(p, p + kHeaderBytes, payload_len, key); s != KVT_OK)
    return s;
  *payload = p + kHeaderBytes;
  return KVT_OK;
}

kvt_status check_value(const uint8_t header[kHeaderBytes], const void *payload,
                       size_t payload_len, const ValueId &want, const uint8_t *key) noexcept {
  if (kvt_status s = check_header(header, want, payload_len, key); s != KVT_OK) return s;
  return check_payload(header, payload, payload_len, key);
}

}  // namespace kvt::remote
