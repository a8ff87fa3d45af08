// fuzz_event_log: the event log's decoder (src/observe/log_format.cpp, compiled in) on bytes
// as a crashed writer or a damaged disk could leave them. The first byte picks a mode: 0
// reads the rest as a log (header, then records to the first one refused); 1 writes a
// correct checksum into each record first, to get past it to the field checks. Whatever is
// accepted must encode back to exactly the bytes it was read from.
#include <xxhash.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "observe/log_format.hpp"

using namespace kvt::obs;

static void check(bool ok, const char *what) {
  if (ok) return;
  std::fprintf(stderr, "fuzz_event_log: %s\n", what);
  std::abort();
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  const bool fix_sums = data[0] & 1;
  std::vector<uint8_t> v(data + 1, data + size);
  if (check_header(v.data(), v.size()) != KVT_OK) {
    check(kvt::last_error()[0] != '\0', "a refused header without a message");
    return 0;
  }
  size_t at = kLogHeaderBytes;
  while (at < v.size()) {
    const size_t left = v.size() - at;
    if (fix_sums && left >= kRecordHeadBytes) {
      uint32_t len = uint32_t(v[at]) | uint32_t(v[at + 1]) << 8 | uint32_t(v[at + 2]) << 16 |
                     uint32_t(v[at + 3]) << 24;
      if (len <= left - kRecordHeadBytes) {
        uint32_t sum = XXH32(v.data() + at + kRecordHeadBytes, len, 0);
        for (int i = 0; i < 4; ++i) v[at + 4 + size_t(i)] = uint8_t(sum >> (8 * i));
      }
    }
    kvt_obs_event e;
    size_t used = 0;
    const char *why = nullptr;
    Decoded d = decode_record(v.data() + at, left, &e, &used, &why);
    if (d != Decoded::Ok) {
      check(why != nullptr && why[0] != '\0', "a refusal without a reason");
      return 0;
    }
    check(used >= kRecordHeadBytes + kPayloadFixed && used <= left, "a bad record length");
    check(e.kind >= KVT_OBS_SLOT && e.kind <= KVT_OBS_DROPPED, "accepted an unknown kind");
    check(strnlen(e.req_id, sizeof e.req_id) <= KVT_REQ_ID_MAX, "an unterminated request id");
    std::string again;
    encode_record(kvt::from_c(e), &again);
    check(again.size() == used && std::memcmp(again.data(), v.data() + at, used) == 0,
          "an accepted record does not encode back to its bytes");
    at += used;
  }
  return 0;
}
