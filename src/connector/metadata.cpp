#include "connector/metadata.hpp"

#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <exception>
#include <limits>
#include <new>
#include <utility>

#include <msgpack.hpp>

#include "common/error.hpp"

namespace kvt::conn {
namespace {

constexpr char kMetaMagic[] = "kvtier-meta";
constexpr char kReportMagic[] = "kvtier-report";
constexpr uint32_t kMetaFields = 9, kReportFields = 8;
// Deeper than any version's messages need (version 1: 5), shallow enough to bound the
// parser's stack.
constexpr uint32_t kMaxDepth = 32;

// ---- encoding

// A msgpack stream that appends to a string.
struct Out {
  std::string bytes;
  void write(const char *p, size_t n) { bytes.append(p, n); }
};
using Packer = msgpack::packer<Out>;

void pack_str(Packer &pk, const std::string &s) {
  pk.pack_str(uint32_t(s.size()));
  pk.pack_str_body(s.data(), uint32_t(s.size()));
}

void pack_head(Packer &pk, uint32_t fields, const char *magic, const Shape &s) {
  pk.pack_array(fields);
  pack_str(pk, magic);
  pk.pack_uint32(kFormatVersion);
  pk.pack_array(4);
  pk.pack_uint32(s.page_size);
  pk.pack_uint64(s.g2_blocks);
  pk.pack_uint64(s.g3_blocks);
  pk.pack_uint32(s.world_size);
}

void pack_batches(Packer &pk, const std::vector<Batch> &batches) {
  pk.pack_array(uint32_t(batches.size()));
  for (const Batch &b : batches) {
    pk.pack_array(3);
    pk.pack_uint64(b.id);
    pack_str(pk, b.req_id);
    pk.pack_array(uint32_t(b.ops.size()));
    for (const CopyOp &op : b.ops) {
      pk.pack_array(5);
      pk.pack_uint32(op.g1);
      pk.pack_uint8(op.tier);
      pk.pack_uint32(op.slot);
      pk.pack_uint64(op.hash);
      pk.pack_uint64(op.parent);
    }
  }
}

void pack_dones(Packer &pk, const std::vector<Done> &dones) {
  pk.pack_array(uint32_t(dones.size()));
  for (const Done &d : dones) {
    pk.pack_array(2);
    pk.pack_uint64(d.id);
    pk.pack_array(uint32_t(d.failed.size()));
    for (const Failure &f : d.failed) {
      pk.pack_array(2);
      pk.pack_uint32(f.op);
      pk.pack_int32(f.status);
    }
  }
}

void pack_ids(Packer &pk, const std::vector<std::string> &ids) {
  pk.pack_array(uint32_t(ids.size()));
  for (const std::string &id : ids) pack_str(pk, id);
}

// ---- decoding, stage 1: the bytes are one complete msgpack value

// Walks the bytes without building anything, so that the object tree built next holds only
// what the bytes really contain: msgpack's unpack allocates an array's elements from its
// header's count before reading them, and a 5-byte header can claim 2^32 of them.
class Scan : public msgpack::null_visitor {
 public:
  bool start_array(uint32_t) { return ++depth_ <= kMaxDepth || (too_deep = true, false); }
  bool end_array() { return --depth_, true; }
  bool start_map(uint32_t) { return start_array(0); }
  bool end_map() { return end_array(); }
  void parse_error(size_t, size_t at) { bad_byte = at; }
  void insufficient_bytes(size_t, size_t) { truncated = true; }

  bool too_deep = false, truncated = false;
  size_t bad_byte = SIZE_MAX;

 private:
  uint32_t depth_ = 0;
};

// ---- decoding, stage 2: the object tree has the message's shape and ranges

// Where a field sits in the message, for error messages: "loads[2].ops[0].tier".
struct Path {
  const Path *up;
  const char *name;   // a field; nullptr for element `index` of up
  size_t index;
};

void append_path(std::string &s, const Path *p) {
  if (!p) return;
  append_path(s, p->up);
  if (p->name) {
    if (!s.empty()) s += '.';
    s += p->name;
  } else {
    s += '[' + std::to_string(p->index) + ']';
  }
}

const char *type_name(const msgpack::object &o) {
  switch (o.type) {
    case msgpack::type::NIL: return "nil";
    case msgpack::type::BOOLEAN: return "a bool";
    case msgpack::type::POSITIVE_INTEGER: return "an unsigned integer";
    case msgpack::type::NEGATIVE_INTEGER: return "a negative integer";
    case msgpack::type::FLOAT32:
    case msgpack::type::FLOAT64: return "a float";
    case msgpack::type::STR: return "a string";
    case msgpack::type::BIN: return "binary";
    case msgpack::type::ARRAY: return "an array";
    case msgpack::type::MAP: return "a map";
    case msgpack::type::EXT: return "an extension";
  }
  return "an unknown type";
}

using Items = const msgpack::object *;

// Reads fields of one message, reporting the first problem as "connector <what>: <path>
// <problem>" with KVT_ERR_CORRUPT.
class Reader {
 public:
  explicit Reader(const char *what) : what_(what) {}

  [[gnu::format(printf, 3, 4)]] kvt_status bad(const Path *p, const char *fmt, ...) const {
    char problem[256];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(problem, sizeof problem, fmt, ap);
    va_end(ap);
    std::string where;
    append_path(where, p);
    return fail(KVT_ERR_CORRUPT, "connector %s: %s %s", what_,
                where.empty() ? "the message" : where.c_str(), problem);
  }

  // A fixed-length array: one of the format's records.
  kvt_status record(const msgpack::object &o, const Path *p, uint32_t fields, Items *items) const {
    if (o.type != msgpack::type::ARRAY)
      return bad(p, "is %s, not an array of %u fields", type_name(o), fields);
    if (o.via.array.size != fields)
      return bad(p, "has %u fields, not %u", o.via.array.size, fields);
    *items = o.via.array.ptr;
    return KVT_OK;
  }

  kvt_status uint(const msgpack::object &o, const Path *p, uint64_t max, uint64_t *out) const {
    if (o.type != msgpack::type::POSITIVE_INTEGER)
      return bad(p, "is %s, not an unsigned integer", type_name(o));
    if (o.via.u64 > max)
      return bad(p, "is %llu, above its maximum %llu", (unsigned long long)o.via.u64,
                 (unsigned long long)max);
    *out = o.via.u64;
    return KVT_OK;
  }

  template <class T>
  kvt_status uint(const msgpack::object &o, const Path *p, T *out) const {
    uint64_t v = 0;
    kvt_status s = uint(o, p, std::numeric_limits<T>::max(), &v);
    if (s == KVT_OK) *out = T(v);
    return s;
  }

  kvt_status boolean(const msgpack::object &o, const Path *p, bool *out) const {
    if (o.type != msgpack::type::BOOLEAN) return bad(p, "is %s, not a bool", type_name(o));
    *out = o.via.boolean;
    return KVT_OK;
  }

  // A request id: 1..KVT_REQ_ID_MAX bytes, no NUL (the C API passes them NUL-terminated).
  kvt_status req_id(const msgpack::object &o, const Path *p, std::string *out) const {
    if (o.type != msgpack::type::STR) return bad(p, "is %s, not a string", type_name(o));
    const uint32_t n = o.via.str.size;
    if (n == 0 || n > KVT_REQ_ID_MAX)
      return bad(p, "is a request id of %u bytes, not 1 to %d", n, KVT_REQ_ID_MAX);
    if (std::memchr(o.via.str.ptr, 0, n)) return bad(p, "is a request id holding a NUL byte");
    out->assign(o.via.str.ptr, n);
    return KVT_OK;
  }

  // A list: each element read by read(element, path, T*).
  template <class T, class Read>
  kvt_status list(const msgpack::object &o, const Path *p, std::vector<T> *out,
                  Read &&read) const {
    if (o.type != msgpack::type::ARRAY) return bad(p, "is %s, not an array", type_name(o));
    // No larger than the bytes: stage 1 saw every element.
    out->resize(o.via.array.size);
    for (uint32_t i = 0; i < o.via.array.size; ++i) {
      const Path e{p, nullptr, i};
      if (kvt_status s = read(o.via.array.ptr[i], &e, &(*out)[i]); s != KVT_OK) return s;
    }
    return KVT_OK;
  }

  kvt_status ids(const msgpack::object &o, const Path *p, std::vector<std::string> *out) const {
    return list(o, p, out, [this](const msgpack::object &e, const Path *ep, std::string *id) {
      return req_id(e, ep, id);
    });
  }

  // The magic string, the format version, the number of fields and the Shape that begin
  // every message. Fields are checked after the version: another version may have others.
  kvt_status head(const msgpack::object &o, const char *magic, uint32_t fields, Items *items,
                  Shape *shape) const {
    if (o.type != msgpack::type::ARRAY || o.via.array.size < 2 ||
        o.via.array.ptr[0].type != msgpack::type::STR)
      return bad(nullptr, "is not an array beginning with the string \"%s\"", magic);
    const msgpack::object_str &m = o.via.array.ptr[0].via.str;
    if (m.size != std::strlen(magic) || std::memcmp(m.ptr, magic, m.size) != 0) {
      const char *other = std::strcmp(magic, kMetaMagic) ? kMetaMagic : kReportMagic;
      if (m.size == std::strlen(other) && std::memcmp(m.ptr, other, m.size) == 0)
        return bad(nullptr, "begins with \"%s\", not \"%s\"", other, magic);
      return bad(nullptr, "does not begin with the string \"%s\"", magic);
    }
    const msgpack::object &v = o.via.array.ptr[1];
    if (v.type != msgpack::type::POSITIVE_INTEGER)
      return bad(nullptr, "has a format version that is %s, not an unsigned integer",
                 type_name(v));
    if (v.via.u64 != kFormatVersion)
      return bad(nullptr, "is format version %llu; this library reads version %u",
                 (unsigned long long)v.via.u64, kFormatVersion);
    if (kvt_status s = record(o, nullptr, fields, items); s != KVT_OK) return s;
    const Path p{nullptr, "shape", 0};
    Items f = nullptr;
    if (kvt_status s = record((*items)[2], &p, 4, &f); s != KVT_OK) return s;
    const Path page{&p, "page_size", 0}, g2{&p, "g2_blocks", 0}, g3{&p, "g3_blocks", 0},
        world{&p, "world_size", 0};
    if (kvt_status s = uint(f[0], &page, &shape->page_size); s != KVT_OK) return s;
    if (kvt_status s = uint(f[1], &g2, &shape->g2_blocks); s != KVT_OK) return s;
    if (kvt_status s = uint(f[2], &g3, &shape->g3_blocks); s != KVT_OK) return s;
    if (kvt_status s = uint(f[3], &world, &shape->world_size); s != KVT_OK) return s;
    if (shape->world_size == 0 || shape->world_size > KVT_MAX_WORLD_SIZE)
      return bad(&world, "is %u, not 1..%d", shape->world_size, KVT_MAX_WORLD_SIZE);
    return KVT_OK;
  }

 private:
  const char *what_;
};

kvt_status read_op(const Reader &r, const Shape &shape, const msgpack::object &o, const Path *p,
                   CopyOp *op) {
  Items f = nullptr;
  if (kvt_status s = r.record(o, p, 5, &f); s != KVT_OK) return s;
  const Path g1{p, "g1", 0}, tier{p, "tier", 0}, slot{p, "slot", 0}, hash{p, "hash", 0},
      parent{p, "parent", 0};
  kvt_status s;
  if ((s = r.uint(f[0], &g1, &op->g1)) != KVT_OK) return s;
  if ((s = r.uint(f[1], &tier, &op->tier)) != KVT_OK) return s;
  if (op->tier != KVT_TIER_G2 && op->tier != KVT_TIER_G3)
    return r.bad(&tier, "is %u, not G2 (%d) or G3 (%d)", unsigned(op->tier), KVT_TIER_G2,
                 KVT_TIER_G3);
  if ((s = r.uint(f[2], &slot, &op->slot)) != KVT_OK) return s;
  const uint64_t cap = op->tier == KVT_TIER_G2 ? shape.g2_blocks : shape.g3_blocks;
  if (op->slot >= cap)
    return r.bad(&slot, "is %u, beyond the message's G%u capacity of %llu blocks", op->slot,
                 unsigned(op->tier), (unsigned long long)cap);
  if ((s = r.uint(f[3], &hash, &op->hash)) != KVT_OK) return s;
  return r.uint(f[4], &parent, &op->parent);
}

kvt_status read_batches(const Reader &r, const Shape &shape, const msgpack::object &o,
                        const Path *p, std::vector<Batch> *out) {
  return r.list(o, p, out, [&](const msgpack::object &e, const Path *ep, Batch *b) {
    Items f = nullptr;
    if (kvt_status s = r.record(e, ep, 3, &f); s != KVT_OK) return s;
    const Path id{ep, "id", 0}, req{ep, "req_id", 0}, ops{ep, "ops", 0};
    kvt_status s;
    if ((s = r.uint(f[0], &id, &b->id)) != KVT_OK) return s;
    if ((s = r.req_id(f[1], &req, &b->req_id)) != KVT_OK) return s;
    return r.list(f[2], &ops, &b->ops, [&](const msgpack::object &oe, const Path *op, CopyOp *c) {
      return read_op(r, shape, oe, op, c);
    });
  });
}

kvt_status read_dones(const Reader &r, const msgpack::object &o, const Path *p,
                      std::vector<Done> *out) {
  return r.list(o, p, out, [&](const msgpack::object &e, const Path *ep, Done *d) {
    Items f = nullptr;
    if (kvt_status s = r.record(e, ep, 2, &f); s != KVT_OK) return s;
    const Path id{ep, "id", 0}, failed{ep, "failed", 0};
    if (kvt_status s = r.uint(f[0], &id, &d->id); s != KVT_OK) return s;
    return r.list(f[1], &failed, &d->failed,
                  [&](const msgpack::object &fe, const Path *fp, Failure *x) {
      Items g = nullptr;
      if (kvt_status s = r.record(fe, fp, 2, &g); s != KVT_OK) return s;
      const Path op{fp, "op", 0}, status{fp, "status", 0};
      if (kvt_status s = r.uint(g[0], &op, &x->op); s != KVT_OK) return s;
      // A failure's status is an error: a negative int32.
      if (g[1].type != msgpack::type::NEGATIVE_INTEGER || g[1].via.i64 < INT32_MIN)
        return r.bad(&status, "is not a kvtier error status (a negative 32-bit integer)");
      x->status = kvt_status(g[1].via.i64);
      return KVT_OK;
    });
  });
}

// Stages 1 and 2 over the bytes, then `read` over the object tree. Allocates no more than
// a small multiple of len.
template <class Read>
kvt_status decode_bytes(const char *what, const void *bytes, size_t len, Read &&read) {
  if (!bytes && len) return fail(KVT_ERR_INVALID_ARGUMENT, "connector %s: NULL bytes", what);
  const char *data = static_cast<const char *>(bytes);
  try {
    Scan scan;
    size_t off = 0;
    const bool parsed = msgpack::parse(data, len, off, scan);
    if (scan.too_deep)
      return fail(KVT_ERR_CORRUPT, "connector %s: nested deeper than %u arrays", what,
                  kMaxDepth);
    if (scan.bad_byte != SIZE_MAX)
      return fail(KVT_ERR_CORRUPT, "connector %s: not msgpack (byte 0x%02x at offset %zu)",
                  what, unsigned(uint8_t(data[scan.bad_byte])), scan.bad_byte);
    if (!parsed || scan.truncated)
      return fail(KVT_ERR_CORRUPT, "connector %s: truncated (%zu bytes end inside the message)",
                  what, len);
    if (off < len)
      return fail(KVT_ERR_CORRUPT, "connector %s: %zu trailing byte(s) after the message", what,
                  len - off);
    // Strings are referenced in the bytes, not copied: they outlive the tree.
    auto reference = [](msgpack::type::object_type, size_t, void *) { return true; };
    const msgpack::unpack_limit limit(len, len, len, len, len, kMaxDepth);
    size_t off2 = 0;
    msgpack::object_handle h = msgpack::unpack(data, len, off2, reference, nullptr, limit);
    return read(Reader(what), h.get());
  } catch (const std::bad_alloc &) {
    return fail(KVT_ERR_NO_MEMORY, "connector %s: out of memory decoding %zu bytes", what, len);
  } catch (const std::exception &e) {
    return fail(KVT_ERR_CORRUPT, "connector %s: not msgpack (%s)", what, e.what());
  }
}

}  // namespace

std::string encode(const Meta &m) {
  Out out;
  Packer pk(out);
  pack_head(pk, kMetaFields, kMetaMagic, m.shape);
  pk.pack_uint64(m.step);
  if (m.async_load) pk.pack_true(); else pk.pack_false();
  pack_batches(pk, m.lazy_stores);
  pack_batches(pk, m.loads);
  pack_batches(pk, m.stores);
  pack_ids(pk, m.finished);
  return std::move(out.bytes);
}

std::string encode(const Report &r) {
  Out out;
  Packer pk(out);
  pack_head(pk, kReportFields, kReportMagic, r.shape);
  pack_dones(pk, r.loads);
  pack_dones(pk, r.stores);
  pack_ids(pk, r.finished_sending);
  pack_ids(pk, r.finished_recving);
  pk.pack_uint32(r.rank);
  return std::move(out.bytes);
}

kvt_status decode(Meta *out, const void *bytes, size_t len) {
  return decode_bytes("metadata", bytes, len, [out](const Reader &r, const msgpack::object &o) {
    Meta m;
    Items f = nullptr;
    if (kvt_status s = r.head(o, kMetaMagic, kMetaFields, &f, &m.shape); s != KVT_OK) return s;
    const Path step{nullptr, "step", 0}, async{nullptr, "async_load", 0},
        lazy{nullptr, "lazy_stores", 0}, loads{nullptr, "loads", 0},
        stores{nullptr, "stores", 0}, finished{nullptr, "finished", 0};
    kvt_status s;
    if ((s = r.uint(f[3], &step, &m.step)) != KVT_OK) return s;
    if ((s = r.boolean(f[4], &async, &m.async_load)) != KVT_OK) return s;
    if ((s = read_batches(r, m.shape, f[5], &lazy, &m.lazy_stores)) != KVT_OK) return s;
    if ((s = read_batches(r, m.shape, f[6], &loads, &m.loads)) != KVT_OK) return s;
    if ((s = read_batches(r, m.shape, f[7], &stores, &m.stores)) != KVT_OK) return s;
    if ((s = r.ids(f[8], &finished, &m.finished)) != KVT_OK) return s;
    *out = std::move(m);
    return KVT_OK;
  });
}

kvt_status decode(Report *out, const void *bytes, size_t len) {
  return decode_bytes("report", bytes, len, [out](const Reader &r, const msgpack::object &o) {
    Report rep;
    Items f = nullptr;
    if (kvt_status s = r.head(o, kReportMagic, kReportFields, &f, &rep.shape); s != KVT_OK)
      return s;
    const Path loads{nullptr, "loads", 0}, stores{nullptr, "stores", 0},
        sending{nullptr, "finished_sending", 0}, recving{nullptr, "finished_recving", 0},
        rank{nullptr, "rank", 0};
    kvt_status s;
    if ((s = read_dones(r, f[3], &loads, &rep.loads)) != KVT_OK) return s;
    if ((s = read_dones(r, f[4], &stores, &rep.stores)) != KVT_OK) return s;
    if ((s = r.ids(f[5], &sending, &rep.finished_sending)) != KVT_OK) return s;
    if ((s = r.ids(f[6], &recving, &rep.finished_recving)) != KVT_OK) return s;
    if ((s = r.uint(f[7], &rank, &rep.rank)) != KVT_OK) return s;
    if (rep.rank >= rep.shape.world_size)
      return r.bad(&rank, "is %u, but the world has %u", rep.rank, rep.shape.world_size);
    *out = std::move(rep);
    return KVT_OK;
  });
}

}  // namespace kvt::conn
