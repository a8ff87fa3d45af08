// Store on Redis: keys placed on plain servers by a HashRing, or on a Redis Cluster's
// masters by their slots. A batch's commands are grouped per node and pipelined, one round
// trip per node (sent to every node first, then read); on a cluster, the commands that come
// back MOVED or ASK go again to the node named, in further rounds.
#include <atomic>
#include <array>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "common/log.hpp"
#include "remote/cluster.hpp"
#include "remote/hash_ring.hpp"
#include "remote/key.hpp"
#include "remote/shard.hpp"
#include "remote/store.hpp"
#include "remote/value_codec.hpp"

namespace kvt::remote {
namespace {

struct Counters {
  std::atomic<uint64_t> lookups{0}, hits{0}, stored{0}, loaded{0}, missing{0}, corrupt{0},
      failed{0}, bytes_written{0}, bytes_read{0}, round_trips{0}, reconnects{0}, redirects{0};
};

void add(std::atomic<uint64_t> &c, uint64_t n) { c.fetch_add(n, std::memory_order_relaxed); }

// Rounds of one batch: the first, then redirections (a slot moving while it is asked for
// costs a MOVED and an ASK). Beyond them, the cluster is changing faster than it answers.
constexpr int kMaxRounds = 6;
constexpr size_t kAsking = SIZE_MAX;  // a Group's entry for an ASKING before an item

// One node's part of a round: per command, its item (or kAsking), then the replies. A GET's
// reply is read into its target: the value's header, then the block's bytes.
struct Group {
  std::vector<size_t> items;
  Request request;
  std::vector<std::array<iovec, 2>> targets;  // one per command, or none
  std::vector<Reply> replies;
  kvt_status status = KVT_OK;
};

// What a batch sends for item i, and where a reply's bulk goes (two iovecs), if anywhere.
struct Command {
  void (*emit)(Request &, std::string_view key, size_t i, const void *ctx);
  const void *ctx;
  std::array<iovec, 2> (*target)(size_t i, const void *ctx) = nullptr;
};

class RedisStore final : public Store {
 public:
  explicit RedisStore(const Config &c)
      : config_(c), keys_{c.key_prefix, c.ns, c.layout, c.cluster} {}

  kvt_status init() {
    std::vector<Endpoint> endpoints;
    for (const std::string &url : config_.urls) {
      Endpoint e;
      if (kvt_status s = parse_endpoint(&e, url); s != KVT_OK) return s;
      endpoints.push_back(std::move(e));
    }
    if (endpoints.empty()) return fail(KVT_ERR_INVALID_ARGUMENT, "g4_url lists no shard");
    if (config_.cluster) {
      cluster_ = std::make_unique<Cluster>(std::move(endpoints), config_.password,
                                           config_.timeout_us, n_.reconnects);
      return KVT_OK;
    }
    std::vector<std::string> names;
    for (Endpoint &e : endpoints) {
      names.push_back(e.name());
      shards_.push_back(std::make_unique<Shard>(std::move(e), config_.password,
                                                config_.timeout_us, n_.reconnects));
    }
    ring_ = std::make_unique<HashRing>(names);
    return KVT_OK;
  }

  kvt_status exists_prefix(size_t *out_n, const uint64_t *hashes, size_t n) override {
    *out_n = 0;
    std::vector<std::string> keys(n);
    for (size_t i = 0; i < n; ++i) keys[i] = keys_.key(hashes[i]);
    std::vector<Reply> replies;
    std::vector<kvt_status> status;
    run(keys, {[](Request &r, std::string_view k, size_t, const void *) { r.add({"EXISTS", k}); },
               nullptr},
        &replies, &status);
    add(n_.lookups, n);
    size_t p = 0;
    for (size_t i = 0; i < n; ++i) {
      if (status[i] != KVT_OK) return KVT_ERR_IO;  // its message is kvt_last_error()'s
      if (replies[i].kind == Reply::Kind::kError) return refused("EXISTS", replies[i]);
    }
    while (p < n && replies[p].kind == Reply::Kind::kInteger && replies[p].integer > 0) ++p;
    add(n_.hits, p);
    *out_n = p;
    return KVT_OK;
  }

  void put(const Put *items, size_t n, kvt_status *status) override {
    struct Ctx {
      const Put *items;
      const uint8_t *headers;
    };
    std::vector<uint8_t> headers(n * kHeaderBytes);
    std::vector<std::string> keys(n);
    for (size_t i = 0; i < n; ++i) {
      const Put &p = items[i];
      encode_header(headers.data() + i * kHeaderBytes,
                    {p.hash, p.parent, config_.ns, config_.layout}, p.data, p.len, key());
      keys[i] = keys_.key(p.hash);
    }
    const Ctx ctx{items, headers.data()};
    std::vector<Reply> replies;
    std::vector<kvt_status> st;
    run(keys,
        {[](Request &r, std::string_view k, size_t i, const void *c) {
           const Ctx &x = *static_cast<const Ctx *>(c);
           r.add_set(k, x.headers + i * kHeaderBytes, kHeaderBytes, x.items[i].data,
                     x.items[i].len);
         },
         &ctx},
        &replies, &st);
    uint64_t stored = 0, bytes = 0, failed = 0;
    for (size_t i = 0; i < n; ++i) {
      status[i] = st[i];
      if (st[i] == KVT_OK && replies[i].kind == Reply::Kind::kError)
        status[i] = refused("SET", replies[i]);  // e.g. OOM under noeviction
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
    struct Ctx {
      Get *items;
      uint8_t *headers;
    };
    std::vector<std::string> keys(n);
    std::vector<uint8_t> headers(n * kHeaderBytes);
    for (size_t i = 0; i < n; ++i) keys[i] = keys_.key(items[i].hash);
    const Ctx ctx{items, headers.data()};
    std::vector<Reply> replies;
    std::vector<kvt_status> st;
    run(keys,
        {[](Request &r, std::string_view k, size_t, const void *) { r.add({"GET", k}); }, &ctx,
         [](size_t i, const void *c) {
           const Ctx &x = *static_cast<const Ctx *>(c);
           return std::array<iovec, 2>{iovec{x.headers + i * kHeaderBytes, kHeaderBytes},
                                       iovec{x.items[i].data, x.items[i].len}};
         }},
        &replies, &st);
    std::vector<std::string> bad;  // keys of corrupt values, to delete
    uint64_t loaded = 0, bytes = 0, missing = 0, corrupt = 0, failed = 0;
    for (size_t i = 0; i < n; ++i) {
      Get &it = items[i];
      it.status = st[i] == KVT_OK ? decode(it, replies[i], headers.data() + i * kHeaderBytes)
                                  : st[i];
      switch (it.status) {
        case KVT_OK: ++loaded, bytes += it.len; break;
        case KVT_ERR_NOT_FOUND: ++missing; break;
        case KVT_ERR_CORRUPT:
          ++corrupt;
          bad.push_back(std::move(keys[i]));
          break;
        default: ++failed;
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
    run(bad, {[](Request &r, std::string_view k, size_t, const void *) { r.add({"DEL", k}); },
              nullptr},
        &replies, &st);
    size_t undeleted = 0;
    for (kvt_status s : st) undeleted += s != KVT_OK;
    if (undeleted > 0)
      log(KVT_LOG_WARN, "G4: could not delete %zu corrupt value(s): %s", undeleted,
          last_error());
    fail(KVT_ERR_CORRUPT, "%s", keep.c_str());
  }

  void stats(kvt_g4_stats *out) const override {
    auto v = [](const std::atomic<uint64_t> &c) { return c.load(std::memory_order_relaxed); };
    out->shards = cluster_ ? cluster_->masters() : uint32_t(shards_.size());
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
    out->redirects = v(n_.redirects);
    out->slot_map_reads = cluster_ ? cluster_->refreshes() : 0;
  }

 private:
  Shard &shard(size_t i) { return cluster_ ? cluster_->node(uint16_t(i)) : *shards_[i]; }

  // The node of a key: by the ring, or by the cluster's route (SIZE_MAX: a slot nobody
  // serves).
  size_t place(std::string_view key, const Cluster::Route *route) const {
    if (!cluster_) return ring_->shard_of(key);
    const uint16_t n = (*route)[key_slot(key)];
    return n == kNoNode ? SIZE_MAX : n;
  }

  // Sends item i's command to the node of keys[i], for every i; (*status)[i] is KVT_OK with
  // its reply in (*replies)[i], or KVT_ERR_IO when its node failed (the message is logged).
  // On a cluster, a MOVED or ASK sends the item again to the node named, and a failed node
  // or a MOVED has the route read again: an item whose node failed goes again only when the
  // new route names another node for it (its replica, promoted).
  void run(const std::vector<std::string> &keys, const Command &cmd,
           std::vector<Reply> *replies, std::vector<kvt_status> *status) {
    const size_t n = keys.size();
    replies->assign(n, Reply{});
    status->assign(n, KVT_OK);
    std::shared_ptr<const Cluster::Route> route;
    if (cluster_ && cluster_->route(&route) != KVT_OK) {
      log(KVT_LOG_WARN, "%s", last_error());
      status->assign(n, KVT_ERR_IO);
      return;
    }
    std::vector<size_t> pending(n), again;
    std::iota(pending.begin(), pending.end(), size_t{0});
    std::vector<size_t> to(n, SIZE_MAX);  // a redirection's node for the next round
    std::vector<uint8_t> asking(n, 0);
    for (int round = 0; !pending.empty(); ++round) {
      if (round == kMaxRounds) {
        fail(KVT_ERR_IO,
             "G4: %zu key(s) still redirected after %d rounds: the cluster's slots are moving",
             pending.size(), kMaxRounds);
        for (size_t i : pending) (*status)[i] = KVT_ERR_IO;
        log(KVT_LOG_WARN, "%s", last_error());
        break;
      }
      std::vector<Group> groups;
      for (size_t i : pending) {
        const size_t node = to[i] != SIZE_MAX ? to[i] : place(keys[i], route.get());
        if (node == SIZE_MAX) {
          (*status)[i] = fail(KVT_ERR_IO, "G4: slot %u is served by no node of the cluster",
                              unsigned(key_slot(keys[i])));
          continue;
        }
        if (groups.size() <= node) groups.resize(node + 1);
        Group &g = groups[node];
        if (asking[i]) {
          g.items.push_back(kAsking);
          g.request.add({"ASKING"});
          if (cmd.target) g.targets.push_back({});
        }
        g.items.push_back(i);
        cmd.emit(g.request, keys[i], i, cmd.ctx);
        if (cmd.target) g.targets.push_back(cmd.target(i, cmd.ctx));
        to[i] = SIZE_MAX;
        asking[i] = 0;
      }
      exchange(groups);
      again.clear();
      bool moved = false, failed = false;
      std::vector<size_t> failed_on(cluster_ ? n : 0, SIZE_MAX);
      for (size_t s = 0; s < groups.size(); ++s) {
        Group &g = groups[s];
        for (size_t j = 0; j < g.items.size(); ++j) {
          const size_t i = g.items[j];
          if (i == kAsking) continue;
          (*status)[i] = g.status;
          if (g.status != KVT_OK) {
            if (cluster_) {
              failed = true;
              failed_on[i] = s;
              again.push_back(i);
            }
            continue;
          }
          Reply &r = g.replies[j];
          Redirect d;
          if (cluster_ && r.kind == Reply::Kind::kError &&
              parse_redirect(&d, r.text, shard(s).endpoint())) {
            const uint16_t t = cluster_->node_at(d.to);
            if (t != kNoNode) {
              to[i] = t;
              asking[i] = d.ask;
              moved |= !d.ask;
              add(n_.redirects, 1);
              again.push_back(i);
              continue;
            }
          }
          (*replies)[i] = std::move(r);
        }
      }
      if (moved || failed) {
        cluster_->refresh(route.get(), moved);
        cluster_->route(&route);
      }
      pending.clear();
      for (size_t i : again) {
        const bool redirected = failed_on.empty() || failed_on[i] == SIZE_MAX;
        if (redirected || place(keys[i], route.get()) != failed_on[i]) pending.push_back(i);
      }
    }
  }

  // Sends every group's request to its node, all at once, then reads every reply; a group
  // whose node fails gets KVT_ERR_IO (and its connection is dropped).
  void exchange(std::vector<Group> &groups) {
    std::vector<std::unique_ptr<Connection>> conns(groups.size());
    std::vector<Connection *> to;
    std::vector<const Request *> requests;
    std::vector<size_t> node;
    for (size_t s = 0; s < groups.size(); ++s) {
      Group &g = groups[s];
      if (g.request.empty()) continue;
      g.status = shard(s).acquire(&conns[s]);
      if (g.status != KVT_OK) continue;
      to.push_back(conns[s].get());
      requests.push_back(&g.request);
      node.push_back(s);
    }
    std::vector<kvt_status> sent(to.size());
    Connection::send_each(to.data(), requests.data(), sent.data(), to.size());
    for (size_t k = 0; k < to.size(); ++k) {
      groups[node[k]].status = sent[k];
      if (sent[k] == KVT_OK) add(n_.round_trips, 1);
    }
    for (size_t s = 0; s < groups.size(); ++s) {
      Group &g = groups[s];
      if (g.request.empty()) continue;
      g.replies.resize(g.request.commands());
      for (size_t j = 0; g.status == KVT_OK && j < g.replies.size(); ++j)
        g.status = g.targets.empty() ? conns[s]->receive(&g.replies[j])
                                     : conns[s]->receive(&g.replies[j], g.targets[j].data(), 2);
      if (conns[s]) shard(s).release(std::move(conns[s]), g.status == KVT_OK);
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
  std::vector<std::unique_ptr<Shard>> shards_;  // plain servers, by the ring
  std::unique_ptr<HashRing> ring_;
  std::unique_ptr<Cluster> cluster_;  // or a cluster's masters, by the slots
};

}  // namespace

kvt_status Store::create(std::unique_ptr<Store> *out, const Config &c) {
  auto s = std::make_unique<RedisStore>(c);
  if (kvt_status st = s->init(); st != KVT_OK) return st;
  *out = std::move(s);
  return KVT_OK;
}

}  // namespace kvt::remote
