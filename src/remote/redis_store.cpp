// Store on Redis: keys placed on shards by a HashRing, each batch's commands grouped per
// shard and pipelined, one round trip per shard (sent to every shard first, then read).
#include <atomic>
#include <array>
#include <memory>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "common/log.hpp"
#include "remote/hash_ring.hpp"
#include "remote/key.hpp"
#include "remote/shard.hpp"
#include "remote/store.hpp"
#include "remote/value_codec.hpp"

namespace kvt::remote {
namespace {

struct Counters {
  std::atomic<uint64_t> lookups{0}, hits{0}, stored{0}, loaded{0}, missing{0}, corrupt{0},
      failed{0}, bytes_written{0}, bytes_read{0}, round_trips{0}, reconnects{0};
};

void add(std::atomic<uint64_t> &c, uint64_t n) { c.fetch_add(n, std::memory_order_relaxed); }

// One shard's part of a batch: the items' indices, their commands, then their replies.
// A GET's reply is read into its target: the value's header, then the block's bytes.
struct Group {
  std::vector<size_t> items;
  Request request;
  std::vector<std::array<iovec, 2>> targets;  // one per command, or none
  std::vector<Reply> replies;
  kvt_status status = KVT_OK;
};

class RedisStore final : public Store {
 public:
  explicit RedisStore(const Config &c) : config_(c), keys_{c.key_prefix, c.ns, c.layout} {}

  kvt_status init() {
    std::vector<std::string> names;
    for (const std::string &url : config_.urls) {
      Endpoint e;
      if (kvt_status s = parse_endpoint(&e, url); s != KVT_OK) return s;
      names.push_back(e.name());
      shards_.push_back(std::make_unique<Shard>(std::move(e), config_.password,
                                                config_.timeout_us, n_.reconnects));
    }
    if (shards_.empty()) return fail(KVT_ERR_INVALID_ARGUMENT, "g4_url lists no shard");
    ring_ = std::make_unique<HashRing>(names);
    return KVT_OK;
  }

  kvt_status exists_prefix(size_t *out_n, const uint64_t *hashes, size_t n) override {
    *out_n = 0;
    std::vector<Group> groups(shards_.size());
    for (size_t i = 0; i < n; ++i) {
      std::string k = keys_.key(hashes[i]);
      Group &g = groups[ring_->shard_of(k)];
      g.items.push_back(i);
      g.request.add({"EXISTS", k});
    }
    exchange(groups);
    add(n_.lookups, n);
    std::vector<bool> found(n, false);
    for (Group &g : groups) {
      if (g.status != KVT_OK) return KVT_ERR_IO;  // its message is kvt_last_error()'s
      for (size_t j = 0; j < g.items.size(); ++j) {
        const Reply &r = g.replies[j];
        if (r.kind == Reply::Kind::kError) return refused("EXISTS", r);
        found[g.items[j]] = r.kind == Reply::Kind::kInteger && r.integer > 0;
      }
    }
    size_t p = 0;
    while (p < n && found[p]) ++p;
    add(n_.hits, p);
    *out_n = p;
    return KVT_OK;
  }

  void put(const Put *items, size_t n, kvt_status *status) override {
    std::vector<Group> groups(shards_.size());
    std::vector<uint8_t> headers(n * kHeaderBytes);
    for (size_t i = 0; i < n; ++i) {
      const Put &p = items[i];
      uint8_t *h = headers.data() + i * kHeaderBytes;
      encode_header(h, {p.hash, p.parent, config_.ns, config_.layout}, p.data, p.len, key());
      std::string k = keys_.key(p.hash);
      Group &g = groups[ring_->shard_of(k)];
      g.items.push_back(i);
      g.request.add_set(k, h, kHeaderBytes, p.data, p.len);
    }
    exchange(groups);
    uint64_t stored = 0, bytes = 0, failed = 0;
    for (Group &g : groups)
      for (size_t j = 0; j < g.items.size(); ++j) {
        size_t i = g.items[j];
        status[i] = g.status;
        if (g.status == KVT_OK && g.replies[j].kind == Reply::Kind::kError)
          status[i] = refused("SET", g.replies[j]);  // e.g. OOM under noeviction
        if (status[i] == KVT_OK) {
          ++stored;
          bytes += items[i].len;
        } else {
          ++failed;
        }
      }
    add(n_.stored, stored);
    add(n_.bytes_written, bytes);
    add(n_.failed, failed);
  }

  void get(Get *items, size_t n) override {
    std::vector<Group> groups(shards_.size());
    std::vector<std::string> keys(n);
    std::vector<uint8_t> headers(n * kHeaderBytes);
    for (size_t i = 0; i < n; ++i) {
      keys[i] = keys_.key(items[i].hash);
      Group &g = groups[ring_->shard_of(keys[i])];
      g.items.push_back(i);
      g.request.add({"GET", keys[i]});
      g.targets.push_back({iovec{headers.data() + i * kHeaderBytes, kHeaderBytes},
                           iovec{items[i].data, items[i].len}});
    }
    exchange(groups);
    std::vector<Group> bad(shards_.size());  // corrupt values, to delete
    uint64_t loaded = 0, bytes = 0, missing = 0, corrupt = 0, failed = 0;
    for (size_t s = 0; s < groups.size(); ++s) {
      Group &g = groups[s];
      for (size_t j = 0; j < g.items.size(); ++j) {
        Get &it = items[g.items[j]];
        it.status = g.status == KVT_OK
                        ? decode(it, g.replies[j], headers.data() + g.items[j] * kHeaderBytes)
                        : g.status;
        switch (it.status) {
          case KVT_OK: ++loaded, bytes += it.len; break;
          case KVT_ERR_NOT_FOUND: ++missing; break;
          case KVT_ERR_CORRUPT:
            ++corrupt;
            bad[s].items.push_back(g.items[j]);
            bad[s].request.add({"DEL", keys[g.items[j]]});
            break;
          default: ++failed;
        }
      }
    }
    add(n_.loaded, loaded);
    add(n_.bytes_read, bytes);
    add(n_.missing, missing);
    add(n_.corrupt, corrupt);
    add(n_.failed, failed);
    if (corrupt == 0) return;
    // Another writer may have replaced a bad value since the GET: deleting a good one then
    // costs a miss, never wrong data. The statuses stand whatever the DEL does.
    std::string keep = last_error();
    exchange(bad);
    for (size_t s = 0; s < bad.size(); ++s)
      if (!bad[s].items.empty() && bad[s].status != KVT_OK)
        log(KVT_LOG_WARN, "G4: could not delete %zu corrupt value(s) on %s: %s",
            bad[s].items.size(), shards_[s]->endpoint().name().c_str(), last_error());
    fail(KVT_ERR_CORRUPT, "%s", keep.c_str());
  }

  void stats(kvt_g4_stats *out) const override {
    auto v = [](const std::atomic<uint64_t> &c) { return c.load(std::memory_order_relaxed); };
    out->shards = uint32_t(shards_.size());
    out->lookups = v(n_.lookups);
    out->hits = v(n_.hits);
    out->stored_blocks = v(n_.stored);
    out->loaded_blocks = v(n_.loaded);
    out->missing_blocks = v(n_.missing);
    out->corrupt_blocks = v(n_.corrupt);
    out->failed_blocks = v(n_.failed);
    out->bytes_written = v(n_.bytes_written);
    out->bytes_read = v(n_.bytes_read);
    out->round_trips = v(n_.round_trips);
    out->reconnects = v(n_.reconnects);
  }

 private:
  // Sends every group's request to its shard, then reads every reply; a group whose shard
  // fails gets KVT_ERR_IO (and its connection is dropped).
  void exchange(std::vector<Group> &groups) {
    std::vector<std::unique_ptr<Connection>> conns(groups.size());
    for (size_t s = 0; s < groups.size(); ++s) {
      Group &g = groups[s];
      if (g.request.empty()) continue;
      g.status = shards_[s]->acquire(&conns[s]);
      if (g.status == KVT_OK) g.status = conns[s]->send(g.request);
      if (g.status == KVT_OK) add(n_.round_trips, 1);
    }
    for (size_t s = 0; s < groups.size(); ++s) {
      Group &g = groups[s];
      if (g.request.empty()) continue;
      g.replies.resize(g.request.commands());
      for (size_t j = 0; g.status == KVT_OK && j < g.replies.size(); ++j)
        g.status = g.targets.empty() ? conns[s]->receive(&g.replies[j])
                                     : conns[s]->receive(&g.replies[j], g.targets[j].data(), 2);
      if (conns[s]) shards_[s]->release(std::move(conns[s]), g.status == KVT_OK);
      if (g.status != KVT_OK)
        log(KVT_LOG_WARN, "G4: %zu command(s) failed: %s", g.request.commands(), last_error());
    }
  }

  // An error reply (OOM, NOAUTH, READONLY...): the shard refuses, which is an I/O failure.
  static kvt_status refused(const char *cmd, const Reply &r) {
    return fail(KVT_ERR_IO, "G4: Redis refused %s: %s", cmd, r.text.c_str());
  }

  // A GET's reply: a value of the block's size was read in place (header, then it.data) and
  // is checked there; one of another size is corrupt, described by its header when short
  // enough to have been kept.
  kvt_status decode(Get &it, const Reply &r, const uint8_t *header) {
    if (r.kind == Reply::Kind::kNil) return KVT_ERR_NOT_FOUND;
    if (r.kind == Reply::Kind::kError) return refused("GET", r);
    if (r.kind != Reply::Kind::kBulk)
      return fail(KVT_ERR_CORRUPT, "G4 value of hash 0x%llx: not a string",
                  static_cast<unsigned long long>(it.hash));
    const ValueId want{it.hash, it.parent, config_.ns, config_.layout};
    const uint8_t *payload = nullptr;
    kvt_status s =
        r.placed ? check_value(header, it.data, it.len, want, key())
        : r.text.size() == r.length
            ? decode_value(r.text.data(), r.text.size(), want, it.len, &payload, key())
            : fail(KVT_ERR_CORRUPT, "G4 value: %llu bytes, where a block's value has %zu",
                   static_cast<unsigned long long>(r.length), kHeaderBytes + it.len);
    if (s != KVT_OK)
      log(KVT_LOG_WARN, "G4: hash 0x%llx: %s; deleting it",
          static_cast<unsigned long long>(it.hash), last_error());
    return s;
  }

  const uint8_t *key() const noexcept {
    return config_.value_key ? config_.value_key->data() : nullptr;
  }

  const Config config_;
  const KeySpace keys_;
  Counters n_;
  std::vector<std::unique_ptr<Shard>> shards_;
  std::unique_ptr<HashRing> ring_;
};

}  // namespace

kvt_status Store::create(std::unique_ptr<Store> *out, const Config &c) {
  auto s = std::make_unique<RedisStore>(c);
  if (kvt_status st = s->init(); st != KVT_OK) return st;
  *out = std::move(s);
  return KVT_OK;
}

}  // namespace kvt::remote
