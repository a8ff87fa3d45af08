// fuzz_g4_value: G4's value decoder (src/remote/value_codec.cpp, compiled in) on bytes as
// Redis could return them. The input is: a mode byte, the expected ids (4 x 8 bytes), the
// expected payload length (2 bytes), then the value. Modes let the fuzzer past the
// checksums: 0 decodes the bytes as they are; 1 first writes a correct header checksum,
// 2 correct payload and header checksums; 3 encodes a value for the bytes as payload, checks
// that it decodes to exactly them and that a reader of the other kind (keyed or not)
// refuses it, then flips one byte and checks that the flip is caught. Bit 2 of the mode
// byte reads (and in mode 3 writes) with a namespace's key: an accepted value must then
// carry its MAC. A refusal must be KVT_ERR_CORRUPT with a message; an acceptance must
// satisfy the header.
#include <sodium.h>
#include <xxhash.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "common/error.hpp"
#include "remote/value_codec.hpp"

using namespace kvt::remote;

static void check(bool ok, const char *what) {
  if (ok) return;
  std::fprintf(stderr, "fuzz_g4_value: %s (%s)\n", what, kvt::last_error());
  std::abort();
}

static uint64_t get64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
static void put64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = uint8_t(v >> (8 * i));
}

// A namespace's key, for the keyed inputs (bit 2 of the first byte).
static const uint8_t kKey[kValueKeyBytes] = {1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11,
                                             12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22,
                                             23, 24, 25, 26, 27, 28, 29, 30, 31, 32};

static void decode_checked(const std::vector<uint8_t> &v, const ValueId &want, size_t len,
                           const uint8_t *key) {
  const uint8_t *payload = nullptr;
  kvt_status s = decode_value(v.data(), v.size(), want, len, &payload, key);
  if (s != KVT_OK) {
    check(s == KVT_ERR_CORRUPT, "a refusal that is not KVT_ERR_CORRUPT");
    check(kvt::last_error()[0] != '\0', "a refusal without a message");
    return;
  }
  check(v.size() == kHeaderBytes + len, "accepted a value of the wrong size");
  check(payload == v.data() + kHeaderBytes, "the payload is not after the header");
  check(std::memcmp(v.data(), "KVG4", 4) == 0, "accepted a value without the magic");
  check(get64(v.data() + 8) == want.hash && get64(v.data() + 16) == want.parent &&
            get64(v.data() + 24) == want.ns && get64(v.data() + 32) == want.layout,
        "accepted a value of other ids");
  check(get64(v.data() + 40) == len, "accepted a value of another length");
  if (!key) {
    check(get64(v.data() + 48) == XXH3_64bits(payload, len), "accepted a bad payload checksum");
    return;
  }
  uint8_t mac[16];  // the keyed BLAKE2b-128 of header bytes 0..48 and the payload
  crypto_generichash_state st;
  crypto_generichash_init(&st, key, kValueKeyBytes, sizeof mac);
  crypto_generichash_update(&st, v.data(), 48);
  crypto_generichash_update(&st, payload, len);
  crypto_generichash_final(&st, mac, sizeof mac);
  check(std::memcmp(mac, v.data() + 48, sizeof mac) == 0, "accepted a value without its MAC");
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  constexpr size_t kPrefix = 1 + 32 + 2;
  if (size < kPrefix) return 0;
  const uint8_t mode = data[0] % 4;
  const uint8_t *key = data[0] & 4 ? kKey : nullptr;
  const ValueId want{get64(data + 1), get64(data + 9), get64(data + 17), get64(data + 25)};
  size_t len = size_t(data[33] | (data[34] << 8));
  std::vector<uint8_t> v(data + kPrefix, data + size);
  if (mode == 3) {
    std::vector<uint8_t> payload = v;
    v.assign(kHeaderBytes, 0);
    v.insert(v.end(), payload.begin(), payload.end());
    encode_header(v.data(), want, payload.data(), payload.size(), key);
    const uint8_t *got = nullptr;
    check(decode_value(v.data(), v.size(), want, payload.size(), &got, key) == KVT_OK,
          "a value just encoded does not decode");
    // Read with the other kind of reader (keyed, or not): refused.
    const uint8_t *other = key ? nullptr : kKey;
    check(decode_value(v.data(), v.size(), want, payload.size(), &got, other) ==
              KVT_ERR_CORRUPT,
          "a value read by a reader of the other kind");
    // An empty vector's data() may be null, which memcmp must not see even for 0 bytes.
    check(payload.empty() || std::memcmp(got, payload.data(), payload.size()) == 0,
          "the payload changed");
    size_t at = len % v.size();
    v[at] ^= uint8_t(1 + data[33] % 255);
    check(decode_value(v.data(), v.size(), want, payload.size(), &got, key) ==
              KVT_ERR_CORRUPT,
          "a flipped byte was not caught");
    return 0;
  }
  if (mode == 2 && v.size() >= kHeaderBytes)
    put64(v.data() + 48, XXH3_64bits(v.data() + kHeaderBytes, v.size() - kHeaderBytes));
  if (mode >= 1 && v.size() >= kHeaderBytes) put64(v.data() + 56, XXH3_64bits(v.data(), 56));
  decode_checked(v, want, len, key);
  return 0;
}
