// fuzz_connector_meta: arbitrary bytes through both decoders of the connector's wire format
// (src/connector/metadata.cpp, compiled into this binary). A refusal is KVT_ERR_CORRUPT with
// a message; whatever decodes holds the decoder's invariants, and encode(decode(x)) decodes
// to the same value and encodes to the same bytes.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "common/error.hpp"
#include "connector/metadata.hpp"

using namespace kvt::conn;

static void check(bool ok, const char *what) {
  if (ok) return;
  std::fprintf(stderr, "fuzz_connector_meta: %s (%s)\n", what, kvt::last_error());
  std::abort();
}

static bool valid_id(const std::string &id) {
  return !id.empty() && id.size() <= KVT_REQ_ID_MAX && id.find('\0') == std::string::npos;
}

static void check_valid(const Meta &m) {
  for (const auto *list : {&m.lazy_stores, &m.loads, &m.stores})
    for (const Batch &b : *list) {
      check(valid_id(b.req_id), "a decoded batch has a bad request id");
      for (const CopyOp &op : b.ops) {
        check(op.tier == KVT_TIER_G2 || op.tier == KVT_TIER_G3, "a decoded op's tier");
        check(op.slot < (op.tier == KVT_TIER_G2 ? m.shape.g2_blocks : m.shape.g3_blocks),
              "a decoded op's slot is beyond the message's shape");
      }
    }
  for (const std::string &id : m.finished) check(valid_id(id), "a decoded finished id");
}

static void check_valid(const Report &r) {
  for (const auto *list : {&r.loads, &r.stores})
    for (const Done &d : *list)
      for (const Failure &f : d.failed) check(f.status < 0, "a decoded failure's status");
  for (const auto *ids : {&r.finished_sending, &r.finished_recving})
    for (const std::string &id : *ids) check(valid_id(id), "a decoded finished id");
}

template <class T>
static void decode_one(const uint8_t *data, size_t size) {
  T v;
  const kvt_status s = decode(&v, data, size);
  if (s != KVT_OK) {
    check(s == KVT_ERR_CORRUPT, "a refusal other than KVT_ERR_CORRUPT");
    check(std::strncmp(kvt::last_error(), "connector ", 10) == 0, "a refusal's message");
    return;
  }
  check_valid(v);
  const std::string once = encode(v);
  T again;
  check(decode(&again, once.data(), once.size()) == KVT_OK, "encode(decode(x)) does not decode");
  check(again == v, "encode(decode(x)) decodes to another value");
  check(encode(again) == once, "encoding is not deterministic");
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  decode_one<Meta>(data, size);
  decode_one<Report>(data, size);
  return 0;
}
