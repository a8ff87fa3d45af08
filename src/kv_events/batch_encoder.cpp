#include "kv_events/batch_encoder.hpp"

#include <endian.h>

#include <cstring>
#include <iterator>

#include <msgpack.hpp>

namespace kvt::pub {
namespace {

constexpr size_t kNone = SIZE_MAX;

struct Out {
  std::string *bytes;
  void write(const char *p, size_t n) { bytes->append(p, n); }
};
using Packer = msgpack::packer<Out>;

void pack_str(Packer &pk, const char *s) {
  uint32_t n = uint32_t(std::char_traits<char>::length(s));
  pk.pack_str(n);
  pk.pack_str_body(s, n);
}

// Token ids straight into the buffer, each in msgpack's shortest unsigned form as
// pack_uint32 writes it: a block of 512 tokens costs one resize, not 512 appends. No branch
// per token (vocabularies mix ids of one, two and three bytes at random): each is one 8-byte
// store of its tag and big-endian bytes, and the cursor moves by its length.
void pack_uints(std::string *out, const uint32_t *v, size_t n) {
  static constexpr uint8_t kTag[4] = {0, 0xcc, 0xcd, 0xce}, kLen[4] = {1, 2, 3, 5};
  static constexpr uint8_t kDrop[4] = {24, 24, 16, 0}, kAfterTag[4] = {0, 8, 8, 8};
  const size_t at = out->size();
  out->resize(at + 5 * n + 3);  // the last store may run 3 bytes past the last token
  char *p = out->data() + at;
  for (size_t i = 0; i < n; ++i) {
    const uint32_t x = v[i];
    const unsigned width = unsigned(x >= 0x80) + (x >= 0x100) + (x >= 0x10000);
    // The bytes of x most significant first, from the lowest address of the word.
    const uint32_t be = __builtin_bswap32(x) >> kDrop[width];
    const uint64_t word = htole64(kTag[width] | uint64_t(be) << kAfterTag[width]);
    std::memcpy(p, &word, sizeof word);
    p += kLen[width];
  }
  out->resize(size_t(p - out->data()));
}

}  // namespace

const char *medium_of(unsigned tier, kvt_kv_events_format format) noexcept {
  // vLLM's MEDIUM_* names. G4 publishes no block events (kv_events_tiers refuses it); its
  // blocks live in Redis, an object store. vLLM 0.11 had no name for local disk: kvtier
  // said "DISK", which the old format keeps.
  static constexpr const char *kMedia[] = {"", "GPU", "CPU", "FS", "OBJ"};
  if (tier == KVT_TIER_G3 && format == KVT_KV_EVENTS_FORMAT_ARRAY_V0_11) return "DISK";
  return tier < std::size(kMedia) ? kMedia[tier] : "";
}

BatchEncoder::BatchEncoder(uint32_t page_size, int32_t dp_rank, unsigned tiers,
                           kvt_kv_events_format format)
    : page_size_(page_size), dp_rank_(dp_rank), tiers_(tiers), format_(format) {}

void BatchEncoder::group(const std::vector<QueuedEvent> &events, TokenMemo *memo) {
  size_t next = 0;  // the first event whose hold take() has not dropped
  try {
    token_at_.assign(events.size(), kNone);
    for (size_t i = 0; i < events.size(); ++i) {
      next = i + 1;  // nothing throws before take(), which drops the hold even when it throws
      const QueuedEvent &e = events[i];
      const unsigned bit = 1u << e.tier;
      if (e.type == KVT_EVENT_TIER_CLEARED) {
        cleared_ |= bit;
        if ((cleared_ & tiers_) == tiers_) {
          groups_.push_back(Group{e.type, e.tier, false, i, i + 1});
          cleared_ = 0;
        }
        continue;
      }
      bool known = false;
      if (e.type == KVT_EVENT_BLOCK_STORED) {
        cleared_ &= ~bit;
        if (memo) {
          size_t at = tokens_.size();
          if ((known = memo->take(e.hash, e.held, &tokens_))) token_at_[i] = at;
          else ++unknown_;
        }
      }
      if (!groups_.empty()) {
        Group &g = groups_.back();
        const QueuedEvent &last = events[g.end - 1];
        bool joins = g.type == e.type && g.tier == e.tier && g.end == i &&
                     (e.type == KVT_EVENT_BLOCK_REMOVED ||
                      (e.parent == last.hash && g.tokens == known));
        if (joins) {
          g.end = i + 1;
          continue;
        }
      }
      groups_.push_back(Group{e.type, e.tier, known, i, i + 1});
    }
  } catch (...) {
    // Out of memory: the blocks not reached keep no hold in the memo.
    for (size_t k = next; memo && k < events.size(); ++k)
      if (const QueuedEvent &e = events[k]; e.type == KVT_EVENT_BLOCK_STORED)
        memo->take(e.hash, e.held, nullptr);
    throw;
  }
}

size_t BatchEncoder::encode(const std::vector<QueuedEvent> &events, double ts, TokenMemo *memo,
                            std::string *out) {
  groups_.clear();
  tokens_.clear();
  unknown_ = 0;
  out->clear();
  group(events, memo);
  if (groups_.empty()) return 0;

  const bool maps = format_ == KVT_KV_EVENTS_FORMAT_CURRENT;
  Out sink{out};
  Packer pk(sink);
  // An event's head: the tagged map of n fields (msgspec's tag=True: "type" first), or the
  // array of the tag and n fields (array_like).
  auto head = [&](const char *tag, uint32_t n) {
    if (maps) {
      pk.pack_map(n + 1);
      pack_str(pk, "type");
    } else {
      pk.pack_array(n + 1);
    }
    pack_str(pk, tag);
  };
  auto field = [&](const char *name) {
    if (maps) pack_str(pk, name);
  };
  pk.pack_array(3);
  pk.pack_double(ts);
  pk.pack_array(uint32_t(groups_.size()));
  for (const Group &g : groups_) {
    const uint32_t n = uint32_t(g.end - g.begin);
    switch (g.type) {
      case KVT_EVENT_BLOCK_STORED: {
        head("BlockStored", maps ? 7 : 6);
        field("block_hashes");
        pk.pack_array(n);
        for (size_t i = g.begin; i < g.end; ++i) pk.pack_uint64(events[i].hash);
        field("parent_block_hash");
        if (uint64_t parent = events[g.begin].parent) pk.pack_uint64(parent);
        else pk.pack_nil();
        field("token_ids");
        pk.pack_array(g.tokens ? n * page_size_ : 0);
        if (g.tokens)  // the blocks' tokens, which the memo gave one after another
          pack_uints(out, tokens_.data() + token_at_[g.begin], size_t(n) * page_size_);
        field("block_size");
        pk.pack_uint32(page_size_);
        field("lora_id");
        pk.pack_nil();
        field("medium");
        pack_str(pk, medium_of(g.tier, format_));
        if (maps) {  // no default, so present; the fields after it are None, omitted
          field("lora_name");
          pk.pack_nil();
        }
        break;
      }
      case KVT_EVENT_BLOCK_REMOVED:
        head("BlockRemoved", 2);
        field("block_hashes");
        pk.pack_array(n);
        for (size_t i = g.begin; i < g.end; ++i) pk.pack_uint64(events[i].hash);
        field("medium");
        pack_str(pk, medium_of(g.tier, format_));
        break;
      default:
        head("AllBlocksCleared", 0);
        break;
    }
  }
  pk.pack_uint32(uint32_t(dp_rank_));
  return groups_.size();
}

}  // namespace kvt::pub
