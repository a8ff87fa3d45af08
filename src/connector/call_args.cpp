#include "connector/call_args.hpp"

#include <algorithm>
#include <cstring>

#include "common/error.hpp"
#include "event/obs_sink.hpp"

namespace kvt::conn {
namespace {

// At most this many values in all of a call's arrays: a few damaged bytes must not ask for
// gigabytes.
constexpr uint64_t kMaxValues = 4u << 20;

void put(std::string *out, uint64_t v) {
  char b[10];
  size_t n = 0;
  do {
    b[n++] = char((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
    v >>= 7;
  } while (v);
  out->append(b, n);
}

// n values as runs of consecutive ones: (start - where the last run ended, zigzagged; length).
// A run never starts where the last one ended (it would have continued it), so the encoding
// of an array is unique.
void put_runs(std::string *out, const uint32_t *v, size_t n) {
  put(out, n);
  int64_t next = 0;
  for (size_t i = 0; i < n;) {
    size_t j = i + 1;
    while (j < n && v[j] == v[j - 1] + 1) ++j;
    const int64_t d = int64_t(v[i]) - next;
    put(out, uint64_t(d << 1) ^ uint64_t(d >> 63));
    put(out, j - i);
    next = int64_t(v[j - 1]) + 1;
    i = j;
  }
}

// Reads what put and put_runs wrote, and only that: a varint in its shortest form, runs as
// put_runs makes them, values within u32 and within the call's budget.
class Reader {
 public:
  Reader(const uint8_t *p, size_t n) : p_(p), end_(p + n) {}
  bool get(uint64_t *v) {
    *v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (p_ == end_) return false;
      const uint8_t b = *p_++;
      *v |= uint64_t(b & 0x7f) << shift;
      if (!(b & 0x80)) return (shift == 0 || b != 0) && (shift < 63 || b <= 1);
    }
    return false;
  }
  bool runs(std::vector<uint32_t> *v) {
    uint64_t n;
    if (!get(&n) || n > budget_) return false;
    budget_ -= n;
    v->clear();
    v->reserve(std::min<uint64_t>(n, left()));  // grows past that only as runs decode
    int64_t next = 0;
    while (v->size() < n) {
      uint64_t z, len;
      if (!get(&z) || !get(&len) || len == 0 || len > n - v->size()) return false;
      if (z == 0 && !v->empty()) return false;  // it would continue the last run
      const uint64_t mag = z >> 1;  // |delta| - (z & 1): within u32 or refused
      if (mag > UINT32_MAX) return false;
      const int64_t delta = (z & 1) ? -int64_t(mag) - 1 : int64_t(mag);
      const int64_t start = next + delta;
      if (start < 0 || start + int64_t(len) - 1 > int64_t(UINT32_MAX)) return false;
      for (uint64_t k = 0; k < len; ++k) v->push_back(uint32_t(start + int64_t(k)));
      next = start + int64_t(len);
    }
    return true;
  }
  bool bytes(std::string *s, size_t max) {
    uint64_t n;
    if (!get(&n) || n > max || n > size_t(end_ - p_)) return false;
    s->assign(reinterpret_cast<const char *>(p_), n);
    p_ += n;
    return true;
  }
  bool done() const { return p_ == end_; }
  size_t left() const { return size_t(end_ - p_); }

 private:
  const uint8_t *p_, *end_;
  uint64_t budget_ = kMaxValues;
};

}  // namespace

std::vector<kvt_scheduled_request> CallArgs::schedule() const {
  std::vector<kvt_scheduled_request> v;
  v.reserve(reqs.size());
  for (const Scheduled &r : reqs)
    v.push_back({r.req_id.c_str(), r.computed, r.scheduled, r.blocks.data(), r.blocks.size(),
                 r.tokens.data(), r.tokens.size()});
  return v;
}

void encode_matched(std::string *out, const uint32_t *tokens, size_t n, uint64_t computed,
                    bool own, const uint64_t *salt, uint64_t max_tokens) {
  const bool capped = max_tokens != UINT64_MAX;
  put(out, uint64_t(own) | uint64_t(salt != nullptr) << 1 | uint64_t(capped) << 2);
  if (salt) put(out, *salt);
  if (capped) put(out, max_tokens);
  put(out, computed);
  if (own)
    put(out, n);
  else
    put_runs(out, tokens, n);
}

void encode_alloc(std::string *out, const uint32_t *blocks, size_t n, uint64_t external) {
  put(out, external);
  put_runs(out, blocks, n);
}

void encode_schedule(std::string *out, const kvt_scheduled_request *reqs, size_t n) {
  put(out, n);
  for (size_t i = 0; i < n; ++i) {
    const kvt_scheduled_request &r = reqs[i];
    const size_t id = strnlen(r.req_id, KVT_REQ_ID_MAX);  // the call checked every id
    put(out, id);
    out->append(r.req_id, id);
    put(out, r.num_computed_tokens);
    put(out, r.num_scheduled_tokens);
    put_runs(out, r.new_block_ids, r.num_new_block_ids);
    put_runs(out, r.new_token_ids, r.num_new_token_ids);
  }
}

kvt_status decode_call(CallArgs *out, uint32_t trigger, const uint8_t *bytes, size_t n) {
  Reader in(bytes, n);
  CallArgs a;
  bool ok = true;
  switch (trigger) {
    case KVT_TRIGGER_GET_NUM_NEW_MATCHED_TOKENS: {
      uint64_t flags;
      ok = in.get(&flags) && flags <= 7;
      a.own_tokens = flags & 1;
      a.salted = flags & 2;
      if (ok && a.salted) ok = in.get(&a.salt);
      // A cap is written only when there is one: UINT64_MAX would be a second encoding.
      if (ok && (flags & 4)) ok = in.get(&a.max_tokens) && a.max_tokens != UINT64_MAX;
      ok = ok && in.get(&a.number);
      if (ok) ok = a.own_tokens ? in.get(&a.num_tokens) : in.runs(&a.ids);
      if (!a.own_tokens) a.num_tokens = a.ids.size();
      break;
    }
    case KVT_TRIGGER_UPDATE_STATE_AFTER_ALLOC:
      ok = in.get(&a.number) && in.runs(&a.ids);
      break;
    case KVT_TRIGGER_BUILD_CONNECTOR_META: {
      uint64_t k;
      ok = in.get(&k) && k <= in.left();  // each request takes bytes
      for (uint64_t i = 0; ok && i < k; ++i) {
        CallArgs::Scheduled r;
        ok = in.bytes(&r.req_id, KVT_REQ_ID_MAX) && !r.req_id.empty() &&
             r.req_id.find('\0') == std::string::npos && in.get(&r.computed) &&
             in.get(&r.scheduled) && in.runs(&r.blocks) && in.runs(&r.tokens);
        if (ok) a.reqs.push_back(std::move(r));
      }
      break;
    }
    case KVT_TRIGGER_UPDATE_CONNECTOR_OUTPUT:
      a.report.assign(reinterpret_cast<const char *>(bytes), n);
      *out = std::move(a);
      return KVT_OK;
    case KVT_TRIGGER_REQUEST_FINISHED:
    case KVT_TRIGGER_REQUEST_PREEMPTED:
    case KVT_TRIGGER_RESET_CACHE:
      break;
    default:
      return fail(KVT_ERR_CORRUPT, "a CALL of unknown call %u", trigger);
  }
  if (!ok || !in.done())
    return fail(KVT_ERR_CORRUPT, "the arguments of a CALL of %s are malformed (%zu bytes)",
                trigger_name(trigger), n);
  *out = std::move(a);
  return KVT_OK;
}

}  // namespace kvt::conn
