#include "event_decoder.hpp"

#include <new>
#include <string_view>

#include <msgpack.hpp>

namespace kvt::router {

namespace {

constexpr size_t kMaxDepth = 8;  // batch, events, event, token_ids, and room for extras

using Obj = msgpack::object;

struct Error {
  std::string what;
};

[[noreturn]] void bad(std::string what) { throw Error{std::move(what)}; }

std::string_view str_of(const Obj &o) { return {o.via.str.ptr, o.via.str.size}; }

// A struct's fields, by position (array_like) or by name (map). `first` skips the tag.
class Fields {
 public:
  Fields(const Obj &o, uint32_t first, std::string where)
      : o_(o), first_(first), where_(std::move(where)) {}

  // The field, or nullptr when it is absent (beyond the array, or not a key of the map).
  const Obj *get(uint32_t index, std::string_view name) const {
    if (o_.type == msgpack::type::ARRAY) {
      uint32_t at = first_ + index;
      return at < o_.via.array.size ? &o_.via.array.ptr[at] : nullptr;
    }
    for (uint32_t i = 0; i < o_.via.map.size; ++i) {
      const msgpack::object_kv &kv = o_.via.map.ptr[i];
      if (kv.key.type == msgpack::type::STR && str_of(kv.key) == name) return &kv.val;
    }
    return nullptr;
  }
  const Obj &need(uint32_t index, std::string_view name) const {
    const Obj *f = get(index, name);
    if (f == nullptr) bad(where_ + ": missing required field '" + std::string(name) + "'");
    return *f;
  }
  std::string where(std::string_view name) const { return where_ + "." + std::string(name); }

 private:
  const Obj &o_;
  uint32_t first_;
  std::string where_;
};

bool is_int(const Obj &o) {
  return o.type == msgpack::type::POSITIVE_INTEGER || o.type == msgpack::type::NEGATIVE_INTEGER;
}

int64_t int_of(const Obj &o, const std::string &where) {
  if (o.type == msgpack::type::NEGATIVE_INTEGER) return o.via.i64;
  if (o.type == msgpack::type::POSITIVE_INTEGER && o.via.u64 <= uint64_t(INT64_MAX))
    return int64_t(o.via.u64);
  bad(where + ": expected an int");
}

// A block hash: any 64-bit integer, kept as its bit pattern.
uint64_t hash_of(const Obj &o, const std::string &where) {
  if (o.type == msgpack::type::POSITIVE_INTEGER) return o.via.u64;
  if (o.type == msgpack::type::NEGATIVE_INTEGER) return uint64_t(o.via.i64);
  bad(where + ": expected an integer block hash");
}

const Obj &array_of(const Obj &o, const std::string &where) {
  if (o.type != msgpack::type::ARRAY) bad(where + ": expected an array");
  return o;
}

std::vector<uint64_t> hashes_of(const Obj &o, const std::string &where) {
  array_of(o, where);
  std::vector<uint64_t> v(o.via.array.size);
  for (uint32_t i = 0; i < o.via.array.size; ++i)
    v[i] = hash_of(o.via.array.ptr[i], where + "[" + std::to_string(i) + "]");
  return v;
}

std::optional<std::string> medium_of(const Obj *o, const std::string &where) {
  if (o == nullptr || o->type == msgpack::type::NIL) return std::nullopt;
  if (o->type != msgpack::type::STR) bad(where + ": expected a str or None");
  return std::string(str_of(*o));
}

Event event_of(const Obj &o, size_t i) {
  const std::string where = "events[" + std::to_string(i) + "]";
  std::string_view tag;
  uint32_t first = 0;
  if (o.type == msgpack::type::ARRAY) {
    if (o.via.array.size == 0 || o.via.array.ptr[0].type != msgpack::type::STR)
      bad(where + ": an array event must start with its tag (a str)");
    tag = str_of(o.via.array.ptr[0]);
    first = 1;
  } else if (o.type == msgpack::type::MAP) {
    Fields f(o, 0, where);
    const Obj *t = f.get(0, "type");
    if (t == nullptr || t->type != msgpack::type::STR)
      bad(where + ": a map event needs its tag, a str under 'type'");
    tag = str_of(*t);
  } else {
    bad(where + ": expected an array or a map");
  }
  Fields f(o, first, where);
  Event e;
  if (tag == "BlockStored") {
    e.kind = EventKind::Stored;
    e.hashes = hashes_of(f.need(0, "block_hashes"), f.where("block_hashes"));
    const Obj &parent = f.need(1, "parent_block_hash");
    if (parent.type != msgpack::type::NIL) e.parent = hash_of(parent, f.where("parent_block_hash"));
    const Obj &tokens = array_of(f.need(2, "token_ids"), f.where("token_ids"));
    for (uint32_t k = 0; k < tokens.via.array.size; ++k)
      if (!is_int(tokens.via.array.ptr[k])) bad(f.where("token_ids") + ": expected ints");
    e.n_tokens = tokens.via.array.size;
    e.block_size = int_of(f.need(3, "block_size"), f.where("block_size"));
    const Obj &lora = f.need(4, "lora_id");
    if (lora.type != msgpack::type::NIL) int_of(lora, f.where("lora_id"));
    e.medium = medium_of(f.get(5, "medium"), f.where("medium"));
  } else if (tag == "BlockRemoved") {
    e.kind = EventKind::Removed;
    e.hashes = hashes_of(f.need(0, "block_hashes"), f.where("block_hashes"));
    e.medium = medium_of(f.get(1, "medium"), f.where("medium"));
  } else if (tag == "AllBlocksCleared") {
    e.kind = EventKind::Cleared;
  } else {
    bad(where + ": unknown tag '" + std::string(tag.substr(0, 64)) + "'");
  }
  return e;
}

Batch batch_of(const Obj &o) {
  if (o.type != msgpack::type::ARRAY && o.type != msgpack::type::MAP)
    bad("batch: expected an array [ts, events, data_parallel_rank] or a map");
  Fields f(o, 0, "batch");
  Batch b;
  const Obj &ts = f.need(0, "ts");
  if (ts.type == msgpack::type::FLOAT64 || ts.type == msgpack::type::FLOAT32) b.ts = ts.via.f64;
  else if (is_int(ts)) b.ts = ts.type == msgpack::type::POSITIVE_INTEGER ? double(ts.via.u64)
                                                                          : double(ts.via.i64);
  else bad("batch.ts: expected a float");
  const Obj &events = array_of(f.need(1, "events"), "batch.events");
  b.events.reserve(events.via.array.size);
  for (uint32_t i = 0; i < events.via.array.size; ++i)
    b.events.push_back(event_of(events.via.array.ptr[i], i));
  if (const Obj *rank = f.get(2, "data_parallel_rank");
      rank != nullptr && rank->type != msgpack::type::NIL)
    b.dp_rank = int_of(*rank, "batch.data_parallel_rank");
  return b;
}

}  // namespace

bool decode_batch(const uint8_t *data, size_t len, Batch *out, std::string *error) {
  try {
    // Limits: msgpack's unpack allocates an array's elements from its header's count, so no
    // count may exceed what the bytes could hold (one byte an element).
    const msgpack::unpack_limit limit(len, len, len, len, len, kMaxDepth);
    size_t off = 0;
    auto reference = [](msgpack::type::object_type, size_t, void *) { return true; };
    msgpack::object_handle h =
        msgpack::unpack(reinterpret_cast<const char *>(data), len, off, reference, nullptr, limit);
    if (off != len) bad(std::to_string(len - off) + " trailing byte(s) after the batch");
    *out = batch_of(h.get());
    return true;
  } catch (const Error &e) {
    *error = e.what;
  } catch (const std::bad_alloc &) {
    *error = "out of memory decoding " + std::to_string(len) + " bytes";
  } catch (const std::exception &e) {
    *error = std::string("not msgpack: ") + e.what();
  }
  return false;
}

}  // namespace kvt::router
