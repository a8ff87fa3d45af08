// fuzz_event_log: the event log's decoder (src/observe/log_format.cpp, compiled in) on bytes
// as a crashed writer or a damaged disk could leave them, and a CALL record's arguments
// through the decoder kvt_event_log_rerun uses (src/connector/call_args.cpp). The first
// byte picks a mode: 0 reads the rest as a log (header, then records to the first one
// refused); 1 writes a correct checksum into each record first, to get past it to the
// field checks. Whatever is accepted must encode back to exactly the bytes it was read
// from, and so must a call's arguments that decode (they have one encoding).
#include <xxhash.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "connector/call_args.hpp"
#include "event/obs_sink.hpp"
#include "observe/log_format.hpp"

using namespace kvt::obs;

static void check(bool ok, const char *what) {
  if (ok) return;
  std::fprintf(stderr, "fuzz_event_log: %s\n", what);
  std::abort();
}

// Arguments that decode encode back to the same bytes (the runs encoding has one form).
static void check_args(uint32_t trigger, const std::string &args) {
  using namespace kvt::conn;
  CallArgs a;
  const auto *p = reinterpret_cast<const uint8_t *>(args.data());
  if (decode_call(&a, trigger, p, args.size()) != KVT_OK) {
    check(kvt::last_error()[0] != '\0', "refused arguments without a message");
    return;
  }
  std::string again;
  switch (trigger) {
    case KVT_TRIGGER_GET_NUM_NEW_MATCHED_TOKENS:
      encode_matched(&again, a.ids.data(), a.own_tokens ? a.num_tokens : a.ids.size(),
                     a.number, a.own_tokens, a.salted ? &a.salt : nullptr, a.max_tokens);
      break;
    case KVT_TRIGGER_UPDATE_STATE_AFTER_ALLOC:
      encode_alloc(&again, a.ids.data(), a.ids.size(), a.number);
      break;
    case KVT_TRIGGER_BUILD_CONNECTOR_META: {
      const auto reqs = a.schedule();
      encode_schedule(&again, reqs.data(), reqs.size());
      break;
    }
    default:
      return;  // a report's bytes are msgpack (fuzz_connector_meta); the rest have none
  }
  check(again == args, "decoded arguments do not encode back to their bytes");
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
    std::string args;
    Decoded d = decode_record(v.data() + at, left, &e, &args, &used, &why);
    if (d != Decoded::Ok) {
      check(why != nullptr && why[0] != '\0', "a refusal without a reason");
      return 0;
    }
    check(used >= kRecordHeadBytes + kPayloadFixed && used <= left, "a bad record length");
    check(e.kind >= KVT_OBS_SLOT && e.kind <= KVT_OBS_CALL, "accepted an unknown kind");
    check(args.empty() || e.kind == KVT_OBS_CALL, "arguments on a record that is not a CALL");
    check(strnlen(e.req_id, sizeof e.req_id) <= KVT_REQ_ID_MAX, "an unterminated request id");
    if (e.kind == KVT_OBS_CALL) check_args(e.trigger, args);
    std::string again;
    kvt::ObsEvent o = kvt::from_c(e);
    o.args = args;
    encode_record(o, &again);
    check(again.size() == used && std::memcmp(again.data(), v.data() + at, used) == 0,
          "an accepted record does not encode back to its bytes");
    at += used;
  }
  return 0;
}
