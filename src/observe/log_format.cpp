#include "observe/log_format.hpp"

#include <xxhash.h>

#include <algorithm>
#include <bit>
#include <cstring>

#include "common/error.hpp"

namespace kvt::obs {
namespace {

// v's bytes at p, least significant first, as every field of the format is.
template <class T>
void store_le(char *p, T v) {
  if constexpr (std::endian::native == std::endian::little) {
    std::memcpy(p, &v, sizeof v);
  } else {
    for (size_t i = 0; i < sizeof v; ++i) p[i] = char(uint64_t(v) >> (8 * i));
  }
}
void put32(std::string *out, uint32_t v) {
  char b[4];
  store_le(b, v);
  out->append(b, 4);
}
uint32_t get32(const uint8_t *p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t(p[i]) << (8 * i);
  return v;
}
uint64_t get64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t(p[i]) << (8 * i);
  return v;
}

}  // namespace

void encode_header(std::string *out) {
  out->append(kLogMagic, sizeof kLogMagic);
  put32(out, kLogFormat);
  put32(out, KVT_OBS_SCHEMA_VERSION);
}

kvt_status check_header(const uint8_t *p, size_t n) {
  if (n < kLogHeaderBytes || std::memcmp(p, kLogMagic, sizeof kLogMagic) != 0)
    return fail(KVT_ERR_CORRUPT, "not a kvtier event log (no KVTEVLOG header)");
  if (uint32_t f = get32(p + 8); f < 1 || f > kLogFormat)
    return fail(KVT_ERR_UNSUPPORTED, "event log format %u; this kvtier reads formats 1 to %u", f,
                kLogFormat);
  if (uint32_t s = get32(p + 12); s < 1 || s > KVT_OBS_SCHEMA_VERSION)
    return fail(KVT_ERR_UNSUPPORTED, "event schema %u; this kvtier reads schemas 1 to %u", s,
                unsigned(KVT_OBS_SCHEMA_VERSION));
  return KVT_OK;
}

void encode_record(const ObsEvent &e, std::string *out) {
  // Written in place at the end of *out, which keeps its capacity between runs: this runs
  // for every event while a log is open, a tier's evictions hundreds at a time.
  const size_t id = std::min<size_t>(e.req_id.size(), KVT_REQ_ID_MAX);
  const size_t args = e.args.size() <= kMaxCallArgs ? e.args.size() : 0;
  static_assert(8 + 8 + 7 * 4 + 9 * 8 + 2 == kPayloadFixed, "the fields below");
  const size_t len = kPayloadFixed + id + args;
  const size_t at = out->size();
  out->resize(at + kRecordHeadBytes + len);
  char *const head = out->data() + at;
  char *p = head + kRecordHeadBytes;
  store_le(p, e.seq), p += 8;
  store_le(p, e.time_ns), p += 8;
  for (uint32_t v : {e.kind, e.state, e.prev, e.trigger, e.src, e.dst, uint32_t(e.status)})
    store_le(p, v), p += 4;
  for (uint64_t v : {e.batch, e.hash, e.parent_hash, e.tokens, e.computed, e.blocks, e.bytes,
                     e.duration_ns, e.count})
    store_le(p, v), p += 8;
  store_le(p, uint16_t(id)), p += 2;
  std::memcpy(p, e.req_id.data(), id);
  std::memcpy(p + id, e.args.data(), args);
  store_le(head, uint32_t(len));
  store_le(head + 4, XXH32(head + kRecordHeadBytes, len, 0));
}

uint32_t record_length(const uint8_t *p) { return get32(p); }

Decoded decode_record(const uint8_t *p, size_t n, kvt_obs_event *out, std::string *args,
                      size_t *used, const char **why) {
  if (n < kRecordHeadBytes) {
    *why = "the bytes end inside a record's length and checksum";
    return Decoded::Short;
  }
  const uint32_t len = get32(p);
  if (len < kPayloadFixed || len > kMaxPayload) {
    *why = "a record's length is out of range";
    return Decoded::Bad;
  }
  if (n - kRecordHeadBytes < len) {
    *why = "the bytes end inside a record";
    return Decoded::Short;
  }
  const uint8_t *q = p + kRecordHeadBytes;
  if (XXH32(q, len, 0) != get32(p + 4)) {
    *why = "a record's checksum does not match";
    return Decoded::Bad;
  }
  kvt_obs_event e{};
  e.seq = get64(q);
  e.time_ns = get64(q + 8);
  uint32_t *u32[] = {&e.kind, &e.state, &e.prev, &e.trigger, &e.src, &e.dst};
  for (size_t i = 0; i < 6; ++i) *u32[i] = get32(q + 16 + 4 * i);
  e.status = kvt_status(int32_t(get32(q + 40)));
  uint64_t *u64[] = {&e.batch,  &e.hash,  &e.parent_hash, &e.tokens, &e.computed,
                     &e.blocks, &e.bytes, &e.duration_ns, &e.count};
  for (size_t i = 0; i < 9; ++i) *u64[i] = get64(q + 44 + 8 * i);
  const size_t id = size_t(q[116]) | size_t(q[117]) << 8;
  if (id > KVT_REQ_ID_MAX || id > len - kPayloadFixed ||
      std::memchr(q + kPayloadFixed, 0, id) != nullptr) {
    *why = "a record's request id is malformed";
    return Decoded::Bad;
  }
  if (e.kind < KVT_OBS_SLOT || e.kind > KVT_OBS_CALL) {
    *why = "a record's kind is unknown";
    return Decoded::Bad;
  }
  const size_t rest = len - kPayloadFixed - id;
  if (rest != 0 && e.kind != KVT_OBS_CALL) {
    *why = "a record that is not a CALL carries arguments";
    return Decoded::Bad;
  }
  std::memcpy(e.req_id, q + kPayloadFixed, id);
  if (args) args->assign(reinterpret_cast<const char *>(q) + kPayloadFixed + id, rest);
  *out = e;
  *used = kRecordHeadBytes + len;
  return Decoded::Ok;
}

}  // namespace kvt::obs
