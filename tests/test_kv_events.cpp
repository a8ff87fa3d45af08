// KV events over ZMQ (docs/KV_EVENTS.md): a real SUB socket and a real DEALER for replay
// against a manager's publisher, the messages decoded with msgpack-cxx field by field. The
// replay tests read the publisher's own counts (kv_events/replay_ledger.hpp) through the
// manager's internals.
#include <gtest/gtest.h>
#include <msgpack.hpp>
#include <stdlib.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zmq.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "abi/objects.hpp"
#include "kvtier.h"
#include "kv_events/publisher.hpp"
#include "support.hpp"

namespace {

using Clock = std::chrono::steady_clock;
constexpr uint32_t kPage = 4;

// A TCP port free on every interface now: bound by the kernel, then closed at once.
int free_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  socklen_t len = sizeof a;
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof a), 0);
  EXPECT_EQ(getsockname(fd, reinterpret_cast<sockaddr *>(&a), &len), 0);
  close(fd);
  return ntohs(a.sin_port);
}

std::string temp_dir() {
  char tmpl[] = "/tmp/kvt-kv-events-XXXXXX";
  const char *d = mkdtemp(tmpl);
  EXPECT_NE(d, nullptr);
  return d ? d : "/tmp";
}

// A ZMQ message of several frames, or none when the wait ran out.
using Frames = std::vector<std::string>;
bool recv_frames(void *s, Frames *out, int timeout_ms) {
  out->clear();
  zmq_pollitem_t item{s, 0, ZMQ_POLLIN, 0};
  if (zmq_poll(&item, 1, timeout_ms) <= 0) return false;
  for (bool more = true; more;) {
    zmq_msg_t m;
    zmq_msg_init(&m);
    if (zmq_msg_recv(&m, s, 0) < 0) return false;
    out->emplace_back(static_cast<const char *>(zmq_msg_data(&m)), zmq_msg_size(&m));
    more = zmq_msg_more(&m);
    zmq_msg_close(&m);
  }
  return true;
}
void send_frames(void *s, const Frames &f) {
  for (size_t i = 0; i < f.size(); ++i)
    zmq_send(s, f[i].data(), f[i].size(), i + 1 < f.size() ? ZMQ_SNDMORE : 0);
}
std::string be64(int64_t v) {
  std::string s(8, '\0');
  for (int i = 7; i >= 0; --i, v = int64_t(uint64_t(v) >> 8)) s[i] = char(v & 0xff);
  return s;
}
uint64_t from_be64(const std::string &s) {
  uint64_t v = 0;
  for (unsigned char c : s) v = v << 8 | c;
  return v;
}

// One block as BlockStored/BlockRemoved describe it, after expanding coalesced events.
struct Block {
  std::string kind;  // "BlockStored", "BlockRemoved", "AllBlocksCleared"
  uint64_t hash = 0;
  bool has_parent = false;
  uint64_t parent = 0;
  std::vector<uint32_t> tokens;
  std::string medium;
  size_t group = 1;  // hashes in the vLLM event this block came from
};

struct Batch {
  uint64_t seq;
  double ts;
  int64_t dp_rank;
  std::vector<Block> blocks;
  size_t events;  // vLLM events, before expansion
  std::string payload;
};

// An event's fields by name, in the order they came: from the tagged map of vLLM main
// ("type" first), or from the tagged array of vLLM 0.11 (named here by position).
std::vector<std::pair<std::string, msgpack::object>> fields_of(const msgpack::object &e,
                                                               kvt_kv_events_format format,
                                                               std::string *tag) {
  std::vector<std::pair<std::string, msgpack::object>> f;
  if (format == KVT_KV_EVENTS_FORMAT_CURRENT) {
    EXPECT_EQ(e.type, msgpack::type::MAP) << "events are maps";
    if (e.type != msgpack::type::MAP || e.via.map.size == 0) return f;
    EXPECT_EQ(e.via.map.ptr[0].key.as<std::string>(), "type") << "msgspec writes the tag first";
    *tag = e.via.map.ptr[0].val.as<std::string>();
    for (uint32_t i = 1; i < e.via.map.size; ++i)
      f.emplace_back(e.via.map.ptr[i].key.as<std::string>(), e.via.map.ptr[i].val);
    return f;
  }
  EXPECT_EQ(e.type, msgpack::type::ARRAY) << "events are tagged arrays";
  if (e.type != msgpack::type::ARRAY || e.via.array.size == 0) return f;
  *tag = e.via.array.ptr[0].as<std::string>();
  static const char *const kStored[] = {"block_hashes", "parent_block_hash", "token_ids",
                                        "block_size", "lora_id", "medium"};
  static const char *const kRemoved[] = {"block_hashes", "medium"};
  const char *const *names = *tag == "BlockStored" ? kStored : kRemoved;
  const size_t n = *tag == "BlockStored" ? 6 : *tag == "BlockRemoved" ? 2 : 0;
  EXPECT_EQ(e.via.array.size, n + 1) << *tag << ": every field, none omitted";
  for (uint32_t i = 1; i < e.via.array.size && i <= n; ++i)
    f.emplace_back(names[i - 1], e.via.array.ptr[i]);
  return f;
}

std::vector<std::string> names_of(const std::vector<std::pair<std::string, msgpack::object>> &f) {
  std::vector<std::string> v;
  for (const auto &[name, value] : f) v.push_back(name);
  return v;
}

// Decodes a payload as vLLM's msgspec decoder would: every field checked, and in the
// current format exactly the fields msgspec writes (those without a default, as
// omit_defaults leaves out the others, which are None here), in declaration order.
Batch decode(const std::string &payload, uint64_t seq,
             kvt_kv_events_format format = KVT_KV_EVENTS_FORMAT_CURRENT) {
  Batch b{seq, 0, -1, {}, 0, payload};
  msgpack::object_handle oh = msgpack::unpack(payload.data(), payload.size());
  const msgpack::object &o = oh.get();
  EXPECT_EQ(o.type, msgpack::type::ARRAY) << "EventBatch is array_like";
  EXPECT_EQ(o.via.array.size, 3u) << "[ts, events, data_parallel_rank]";
  EXPECT_EQ(o.via.array.ptr[0].type, msgpack::type::FLOAT64);
  b.ts = o.via.array.ptr[0].as<double>();
  b.dp_rank = o.via.array.ptr[2].as<int64_t>();
  const msgpack::object &evs = o.via.array.ptr[1];
  EXPECT_EQ(evs.type, msgpack::type::ARRAY);
  b.events = evs.via.array.size;
  const bool current = format == KVT_KV_EVENTS_FORMAT_CURRENT;
  for (uint32_t i = 0; i < evs.via.array.size; ++i) {
    std::string tag;
    const auto f = fields_of(evs.via.array.ptr[i], format, &tag);
    auto field = [&](const char *name) -> const msgpack::object & {
      for (const auto &[n, v] : f)
        if (n == name) return v;
      static const msgpack::object nil;
      ADD_FAILURE() << tag << " lacks " << name;
      return nil;
    };
    if (tag == "AllBlocksCleared") {
      EXPECT_TRUE(f.empty());
      Block cleared;
      cleared.kind = tag;
      b.blocks.push_back(cleared);
      continue;
    }
    auto hashes = field("block_hashes").as<std::vector<uint64_t>>();
    const std::string medium = field("medium").as<std::string>();
    if (tag == "BlockRemoved") {
      EXPECT_EQ(names_of(f), (std::vector<std::string>{"block_hashes", "medium"}));
      for (uint64_t h : hashes)
        b.blocks.push_back(Block{tag, h, false, 0, {}, medium, hashes.size()});
      continue;
    }
    EXPECT_EQ(tag, "BlockStored");
    std::vector<std::string> want = {"block_hashes", "parent_block_hash", "token_ids",
                                     "block_size",   "lora_id",           "medium"};
    if (current) {
      want.push_back("lora_name");
      EXPECT_EQ(field("lora_name").type, msgpack::type::NIL) << "lora_name";
    }
    EXPECT_EQ(names_of(f), want);
    const msgpack::object &parent = field("parent_block_hash");
    auto tokens = field("token_ids").as<std::vector<uint32_t>>();
    EXPECT_EQ(field("block_size").as<uint32_t>(), kPage) << "block_size";
    EXPECT_EQ(field("lora_id").type, msgpack::type::NIL) << "lora_id";
    EXPECT_TRUE(tokens.empty() || tokens.size() == hashes.size() * kPage);
    for (size_t k = 0; k < hashes.size(); ++k) {
      Block blk{tag, hashes[k], true, 0, {}, medium, hashes.size()};
      if (k > 0) blk.parent = hashes[k - 1];
      else if (parent.type == msgpack::type::NIL) blk.has_parent = false;
      else blk.parent = parent.as<uint64_t>();
      if (!tokens.empty())
        blk.tokens.assign(tokens.begin() + k * kPage, tokens.begin() + (k + 1) * kPage);
      b.blocks.push_back(blk);
    }
  }
  return b;
}

void churn(kvt_manager *m, uint64_t first, size_t n);

class KvEvents : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = temp_dir();
    endpoint_ = "ipc://" + dir_ + "/pub";
    replay_ = "ipc://" + dir_ + "/replay";
    ctx_ = zmq_ctx_new();
  }
  void TearDown() override {
    if (m_) kvt_manager_destroy(m_);
    if (sub_) zmq_close(sub_);
    zmq_ctx_term(ctx_);
    std::string rm = "rm -rf " + dir_;
    ASSERT_EQ(system(rm.c_str()), 0);
  }
  kvt_manager_config config() {
    kvt_manager_config c;
    kvt_manager_config_init(&c);
    c.page_size = kPage;
    c.chunk_bytes = 64;
    c.g1_blocks = 8;
    c.g2_blocks = 16;
    c.kv_events_endpoint = endpoint_.c_str();
    c.kv_events_replay_endpoint = replay_.c_str();
    c.kv_events_topic = "kv";
    c.kv_events_dp_rank = 3;
    c.kv_events_format = format_;
    return c;
  }
  void create(const kvt_manager_config &c) { ASSERT_EQ(kvt_manager_create(&m_, &c), KVT_OK); }
  void subscribe(const std::string &endpoint, const char *topic = "kv") {
    sub_ = zmq_socket(ctx_, ZMQ_SUB);
    ASSERT_EQ(zmq_setsockopt(sub_, ZMQ_SUBSCRIBE, topic, strlen(topic)), 0);
    ASSERT_EQ(zmq_connect(sub_, endpoint.c_str()), 0);
  }
  // Waits until the subscription works: kvt_manager_reset of every tier, empty, publishes
  // one AllBlocksCleared each; then drains those. Returns the next seq to expect.
  uint64_t sync() {
    if (m_ == nullptr) {
      ADD_FAILURE() << "no manager";
      return 0;
    }
    Frames f;
    uint64_t last = 0;
    bool got = false;
    for (int i = 0; i < 600 && !got; ++i) {
      EXPECT_EQ(kvt_manager_reset(m_, 0), KVT_OK);
      got = recv_frames(sub_, &f, 100);
    }
    EXPECT_TRUE(got) << "the subscriber never received anything";
    while (got) {
      last = from_be64(f.at(1));
      EXPECT_EQ(decode(f.at(2), last, format_).blocks.at(0).kind, "AllBlocksCleared");
      got = recv_frames(sub_, &f, 300);
    }
    return last + 1;
  }
  // Receives messages until `blocks` expanded blocks arrived, checking topic and seqs.
  std::vector<Batch> receive(uint64_t *next_seq, size_t blocks) {
    std::vector<Batch> out;
    size_t have = 0;
    Frames f;
    while (have < blocks && recv_frames(sub_, &f, 10000)) {
      EXPECT_EQ(f.size(), 3u);
      EXPECT_EQ(f[0], "kv");
      EXPECT_EQ(f[1].size(), 8u);
      uint64_t seq = from_be64(f[1]);
      EXPECT_EQ(seq, *next_seq) << "sequence numbers are consecutive";
      *next_seq = seq + 1;
      out.push_back(decode(f[2], seq, format_));
      seen_.push_back(out.back());
      have += out.back().blocks.size();
    }
    EXPECT_EQ(have, blocks);
    return out;
  }
  static std::vector<Block> flat(const std::vector<Batch> &batches) {
    std::vector<Block> v;
    for (const Batch &b : batches) v.insert(v.end(), b.blocks.begin(), b.blocks.end());
    return v;
  }
  uint64_t salt() {
    uint64_t s;
    EXPECT_EQ(kvt_hash_salt(&s, "kv", 2), KVT_OK);
    return s;
  }
  std::vector<uint64_t> hashes(const std::vector<uint32_t> &tokens) {
    std::vector<uint64_t> h(tokens.size() / kPage);
    size_t n = 0;
    EXPECT_EQ(kvt_hash_tokens(h.data(), h.size(), &n, salt(), tokens.data(), tokens.size(), kPage),
              KVT_OK);
    return h;
  }
  // Offloads n blocks to tier dst and waits for the copy.
  void offload(const kvt_block *b, size_t n, kvt_tier dst) {
    kvt_xfer *x = nullptr;
    ASSERT_EQ(kvt_xfer_offload(&x, m_, b, n, dst, nullptr, 0), KVT_OK) << kvt_last_error();
    ASSERT_EQ(kvt_xfer_wait(x, -1), KVT_OK) << kvt_last_error();
    kvt_xfer_release(x);
  }
  // A block registered through the token path; returns its handle.
  kvt_block register_tokens(const uint32_t *tokens, uint64_t parent) {
    kvt_block b = 0, out = 0;
    EXPECT_EQ(kvt_block_alloc(&b, 1, m_, KVT_TIER_G1), KVT_OK);
    EXPECT_EQ(kvt_block_init(m_, b, salt(), parent), KVT_OK);
    EXPECT_EQ(kvt_block_append(m_, b, tokens, kPage), KVT_OK);
    EXPECT_EQ(kvt_block_schedule(m_, b), KVT_OK);
    EXPECT_EQ(kvt_block_compute_done(m_, b), KVT_OK);
    EXPECT_EQ(kvt_block_register(&out, m_, b), KVT_OK);
    return out;
  }
  // Asks the replay socket from a DEALER (as vLLM's REQ clients: an empty delimiter first).
  std::vector<Batch> replay_from(uint64_t start) { return ask(be64(int64_t(start))); }
  // The same with any request frame (KVTIER_SNAPSHOT).
  std::vector<Batch> ask(const std::string &request) {
    void *d = zmq_socket(ctx_, ZMQ_DEALER);
    EXPECT_EQ(zmq_connect(d, replay_.c_str()), 0);
    send_frames(d, {"", request});
    std::vector<Batch> out;
    Frames f;
    while (recv_frames(d, &f, 10000)) {
      if (format_ == KVT_KV_EVENTS_FORMAT_CURRENT) {
        // vLLM #45177: [empty, topic, seq, payload], the end [empty, empty, -1, empty].
        EXPECT_EQ(f.size(), 4u) << "[empty, topic, seq, payload]";
        if (f.size() != 4) break;
        EXPECT_EQ(f[0], "");
        if (f[2] == be64(-1)) {
          EXPECT_EQ(f[1], "") << "the end marker: no topic";
          EXPECT_EQ(f[3], "") << "the end marker: seq -1, empty payload";
          zmq_close(d);
          return out;
        }
        EXPECT_EQ(f[1], "kv") << "the topic";
        f.erase(f.begin() + 1);
      }
      EXPECT_EQ(f.size(), 3u) << "[empty, seq, payload]";
      if (f.size() != 3) break;
      EXPECT_EQ(f[0], "");
      if (f[1] == be64(-1)) {
        EXPECT_EQ(f[2], "") << "the end marker: seq -1, empty payload";
        zmq_close(d);
        return out;
      }
      out.push_back(decode(f[2], from_be64(f[1]), format_));
    }
    ADD_FAILURE() << "no end marker";
    zmq_close(d);
    return out;
  }

  void check_every_field();
  void keep_big_batches(size_t batches, size_t blocks);

  std::string dir_, endpoint_, replay_;
  kvt_kv_events_format format_ = KVT_KV_EVENTS_FORMAT_CURRENT;
  std::vector<Batch> seen_;  // what receive() got
  void *ctx_ = nullptr, *sub_ = nullptr;
  kvt_manager *m_ = nullptr;
};

void KvEvents::check_every_field() {
  create(config());
  subscribe(endpoint_);
  uint64_t seq = sync();

  // Two blocks through kvt_block_append: their tokens are the tier's.
  const std::vector<uint32_t> a = {11, 12, 13, 14, 15, 16, 17, 18};
  const std::vector<uint64_t> ha = hashes(a);
  kvt_block a0 = register_tokens(a.data(), 0);
  kvt_block a1 = register_tokens(a.data() + kPage, ha[0]);
  // Two by hash, their tokens noted first; one by hash whose tokens nobody noted.
  const std::vector<uint32_t> b = {21, 22, 23, 24, 25, 26, 27, 28};
  const std::vector<uint64_t> hb = hashes(b);
  ASSERT_EQ(kvt_manager_note_tokens(m_, hb.data(), 2, b.data()), KVT_OK);
  kvt_block bb[3];
  ASSERT_EQ(kvt_block_alloc(bb, 3, m_, KVT_TIER_G1), KVT_OK);
  ASSERT_EQ(kvt_block_register_hashes(bb, m_, bb, hb.data(), 2, 0), KVT_OK);
  const uint64_t unknown = 0x123456789abcdef0;
  ASSERT_EQ(kvt_block_register_hash(&bb[2], m_, bb[2], unknown, hb[1]), KVT_OK);

  std::vector<Batch> got = receive(&seq, 5);
  std::vector<Block> v = flat(got);
  ASSERT_EQ(v.size(), 5u);
  for (const Block &x : v) {
    EXPECT_EQ(x.kind, "BlockStored");
    EXPECT_EQ(x.medium, "GPU");
  }
  EXPECT_EQ(v[0].hash, ha[0]);
  EXPECT_FALSE(v[0].has_parent) << "a first block's parent_block_hash is nil";
  EXPECT_EQ(v[0].tokens, std::vector<uint32_t>(a.begin(), a.begin() + 4));
  EXPECT_EQ(v[1].hash, ha[1]);
  EXPECT_EQ(v[1].parent, ha[0]);
  EXPECT_EQ(v[1].tokens, std::vector<uint32_t>(a.begin() + 4, a.end()));
  EXPECT_EQ(v[2].hash, hb[0]);
  EXPECT_FALSE(v[2].has_parent);
  EXPECT_EQ(v[2].tokens, std::vector<uint32_t>(b.begin(), b.begin() + 4));
  EXPECT_EQ(v[3].hash, hb[1]);
  EXPECT_EQ(v[3].parent, hb[0]);
  EXPECT_EQ(v[3].tokens, std::vector<uint32_t>(b.begin() + 4, b.end()));
  EXPECT_EQ(v[4].hash, unknown);
  EXPECT_EQ(v[4].parent, hb[1]);
  EXPECT_TRUE(v[4].tokens.empty()) << "tokens never noted: token_ids is empty";
  for (const Batch &x : got) {
    EXPECT_EQ(x.dp_rank, 3);
    double now = std::chrono::duration<double>(
                     std::chrono::system_clock::now().time_since_epoch()).count();
    EXPECT_NEAR(x.ts, now, 60.0) << "ts: seconds since the epoch";
  }
  // One call's chain is one batch, coalesced into one BlockStored of two hashes.
  bool coalesced = false;
  for (const Block &x : v) coalesced |= x.hash == hb[0] && x.group >= 2;
  EXPECT_TRUE(coalesced);

  // Offload to G2: stored there as "CPU", the tokens from the memo.
  kvt_block src[2] = {a0, a1};
  ASSERT_NO_FATAL_FAILURE(offload(src, 2, KVT_TIER_G2));
  v = flat(receive(&seq, 2));
  ASSERT_EQ(v.size(), 2u);
  EXPECT_EQ(v[0].kind, "BlockStored");
  EXPECT_EQ(v[0].medium, "CPU");
  EXPECT_EQ(v[0].hash, ha[0]);
  EXPECT_FALSE(v[0].has_parent);
  EXPECT_EQ(v[0].tokens, std::vector<uint32_t>(a.begin(), a.begin() + 4));
  EXPECT_EQ(v[1].hash, ha[1]);
  EXPECT_EQ(v[1].parent, ha[0]);
  EXPECT_EQ(v[1].tokens, std::vector<uint32_t>(a.begin() + 4, a.end()));

  // Resetting G2 alone: BlockRemoved, and no AllBlocksCleared (G1 still holds blocks).
  ASSERT_EQ(kvt_manager_reset(m_, KVT_TIER_G2), KVT_OK);
  v = flat(receive(&seq, 2));
  ASSERT_EQ(v.size(), 2u);
  for (const Block &r : v) {
    EXPECT_EQ(r.kind, "BlockRemoved");
    EXPECT_EQ(r.medium, "CPU");
  }
  // Resetting everything: G1's five blocks removed, then one AllBlocksCleared.
  kvt_block held[5] = {a0, a1, bb[0], bb[1], bb[2]};
  ASSERT_EQ(kvt_block_release(m_, held, 5), KVT_OK);
  ASSERT_EQ(kvt_manager_reset(m_, 0), KVT_OK);
  v = flat(receive(&seq, 6));
  ASSERT_EQ(v.size(), 6u);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(v[i].kind, "BlockRemoved");
    EXPECT_EQ(v[i].medium, "GPU");
  }
  EXPECT_EQ(v[5].kind, "AllBlocksCleared");

  // Replay from a seq: the same bytes as published, then the end marker.
  std::vector<Batch> all = replay_from(0);
  ASSERT_GE(all.size(), 4u);
  for (size_t i = 0; i < all.size(); ++i) EXPECT_EQ(all[i].seq, i);
  for (const Batch &b : seen_) {
    ASSERT_LT(b.seq, all.size());
    EXPECT_EQ(all[b.seq].payload, b.payload) << "replay gives the bytes published";
  }
  std::vector<Batch> tail = replay_from(all.size() - 2);
  ASSERT_EQ(tail.size(), 2u);
  EXPECT_EQ(tail[0].payload, all[all.size() - 2].payload);
  EXPECT_EQ(tail[1].payload, all.back().payload);
  EXPECT_TRUE(replay_from(all.size()).empty()) << "nothing kept from there: the marker alone";
}

TEST_F(KvEvents, EveryFieldOfStoredRemovedAndCleared) { check_every_field(); }

TEST_F(KvEvents, EveryFieldInTheOldArrayFormat) {
  format_ = KVT_KV_EVENTS_FORMAT_ARRAY_V0_11;
  check_every_field();
}

// The payload's bytes as msgspec writes KVEventBatch of vLLM main: written out by hand here,
// byte by byte, from msgpack's spec. The token ids take every width msgpack has for them.
TEST_F(KvEvents, PayloadBytesAsMsgspecWritesThem) {
  create(config());
  subscribe(endpoint_);
  uint64_t seq = sync();
  const std::vector<uint32_t> t = {1, 0x7f, 0x80, 0xff, 0x100, 0xffff, 0x10000, 0xffffffff};
  const std::vector<uint64_t> h = hashes(t);
  ASSERT_EQ(kvt_manager_note_tokens(m_, h.data(), 2, t.data()), KVT_OK);
  kvt_block b[2];
  ASSERT_EQ(kvt_block_alloc(b, 2, m_, KVT_TIER_G1), KVT_OK);
  ASSERT_EQ(kvt_block_register_hashes(b, m_, b, h.data(), 2, 0), KVT_OK);
  std::vector<Batch> got = receive(&seq, 2);
  ASSERT_EQ(got.size(), 1u);
  auto str = [](const std::string &s) { return char(0xa0 | s.size()) + s; };  // fixstr
  auto u64 = [](uint64_t v) { return std::string(1, char(0xcf)) + be64(int64_t(v)); };
  std::string want = "\x93";                          // [ts, events, data_parallel_rank]
  want += got[0].payload.substr(1, 9);                // ts: float64 (0xcb and 8 bytes)
  want += "\x91\x88" + str("type") + str("BlockStored");  // [{8 entries}]
  want += str("block_hashes") + "\x92" + u64(h[0]) + u64(h[1]);
  want += str("parent_block_hash") + "\xc0";
  want += str("token_ids") + "\x98\x01\x7f\xcc\x80\xcc\xff" + std::string("\xcd\x01\x00", 3) +
          "\xcd\xff\xff" + std::string("\xce\x00\x01\x00\x00", 5) + "\xce\xff\xff\xff\xff";
  want += str("block_size") + "\x04" + str("lora_id") + "\xc0";
  want += str("medium") + str("GPU") + str("lora_name") + "\xc0";
  want += "\x03";                                     // data_parallel_rank 3
  EXPECT_EQ(uint8_t(got[0].payload[1]), 0xcb);
  EXPECT_EQ(got[0].payload, want);
  ASSERT_EQ(kvt_block_release(m_, b, 2), KVT_OK);
  ASSERT_EQ(kvt_manager_reset(m_, 0), KVT_OK);
  got = receive(&seq, 3);
  // The events, in one batch or two (the publisher may wake between G1's reset and G2's).
  const std::string events[] = {"\x83" + str("type") + str("BlockRemoved") +
                                    str("block_hashes") + "\x92" + u64(h[0]) + u64(h[1]) +
                                    str("medium") + str("GPU"),
                                "\x81" + str("type") + str("AllBlocksCleared")};
  size_t next = 0;
  for (const Batch &x : got) {
    ASSERT_LE(next + x.events, 2u);
    want = "\x93" + x.payload.substr(1, 9) + char(0x90 | x.events);
    for (size_t k = 0; k < x.events; ++k) want += events[next++];
    EXPECT_EQ(x.payload, want + "\x03");
  }
  EXPECT_EQ(next, 2u);
}

// vLLM's media: G1 "GPU", G2 "CPU", G3 "FS" ("DISK" in the old format).
TEST_F(KvEvents, MediaOfEveryTier) {
  for (kvt_kv_events_format format :
       {KVT_KV_EVENTS_FORMAT_CURRENT, KVT_KV_EVENTS_FORMAT_ARRAY_V0_11}) {
    SCOPED_TRACE(format);
    format_ = format;
    kvt_manager_config c = config();
    c.g3_blocks = 16;
    c.g3_io = kvt_test::test_g3_io(c.g3_io);
    create(c);
    if (!sub_) subscribe(endpoint_);
    uint64_t seq = sync();
    const std::vector<uint32_t> t = {9, 8, 7, 6};
    const uint64_t h = hashes(t)[0];
    ASSERT_EQ(kvt_manager_note_tokens(m_, &h, 1, t.data()), KVT_OK);
    kvt_block b;
    ASSERT_EQ(kvt_block_alloc(&b, 1, m_, KVT_TIER_G1), KVT_OK);
    ASSERT_EQ(kvt_block_register_hash(&b, m_, b, h, 0), KVT_OK);
    for (kvt_tier dst : {KVT_TIER_G2, KVT_TIER_G3})
      ASSERT_NO_FATAL_FAILURE(offload(&b, 1, dst));
    std::vector<Block> v = flat(receive(&seq, 3));
    ASSERT_EQ(v.size(), 3u);
    const char *g3 = format == KVT_KV_EVENTS_FORMAT_CURRENT ? "FS" : "DISK";
    EXPECT_EQ(v[0].medium, "GPU");
    EXPECT_EQ(v[1].medium, "CPU");
    EXPECT_EQ(v[2].medium, g3);
    for (const Block &x : v) EXPECT_EQ(x.tokens, t) << x.medium;
    ASSERT_EQ(kvt_block_release(m_, &b, 1), KVT_OK);
    kvt_manager_destroy(m_);
    m_ = nullptr;
  }
}

// A manager that starts announces itself before anything else: AllBlocksCleared (a router
// drops what it held for this instance before a restart), then a BlockStored for each block
// that its persistent G3 recovered, with its parent and no tokens (nobody noted them since).
TEST_F(KvEvents, AStartAnnouncesItselfAndWhatAPersistentG3Recovered) {
  kvt_manager_config c = config();
  const std::string g3_dir = dir_ + "/g3";
  ASSERT_EQ(system(("mkdir -p " + g3_dir).c_str()), 0);
  c.g3_blocks = 16;
  c.g3_path = g3_dir.c_str();
  c.g3_persist = 1;
  c.g3_io = kvt_test::test_g3_io(c.g3_io);
  create(c);
  // The first start: the announcement alone (nothing was recovered).
  std::vector<Block> v;
  for (int i = 0; i < 100 && v.empty(); ++i) v = flat(replay_from(0));
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].kind, "AllBlocksCleared");
  // A chain of three blocks offloaded to G3, which keeps them across the restart.
  const uint64_t h[3] = {0x111, 0x222, 0x333};
  kvt_block b[3], reg[3];
  ASSERT_EQ(kvt_block_alloc(b, 3, m_, KVT_TIER_G1), KVT_OK);
  ASSERT_EQ(kvt_block_register_hashes(reg, m_, b, h, 3, 0), KVT_OK);
  ASSERT_NO_FATAL_FAILURE(offload(reg, 3, KVT_TIER_G3));
  ASSERT_EQ(kvt_block_release(m_, reg, 3), KVT_OK);
  kvt_manager_destroy(m_);
  m_ = nullptr;

  create(c);  // the restart: G1's blocks are gone, G3's three came back
  kvt_tier_stats g3{};
  g3.struct_size = sizeof g3;
  ASSERT_EQ(kvt_tier_stats_get(&g3, m_, KVT_TIER_G3), KVT_OK);
  ASSERT_EQ(g3.recovered, 3u);
  v.clear();
  for (int i = 0; i < 100 && v.size() < 4; ++i) v = flat(replay_from(0));
  ASSERT_EQ(v.size(), 4u);
  EXPECT_EQ(v[0].kind, "AllBlocksCleared");
  std::vector<std::pair<uint64_t, uint64_t>> got;  // (hash, parent), in any order
  for (size_t i = 1; i < v.size(); ++i) {
    EXPECT_EQ(v[i].kind, "BlockStored");
    EXPECT_EQ(v[i].medium, "FS");
    EXPECT_TRUE(v[i].tokens.empty());
    got.push_back({v[i].hash, v[i].has_parent ? v[i].parent : 0});
  }
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, (std::vector<std::pair<uint64_t, uint64_t>>{
                     {0x111, 0}, {0x222, 0x111}, {0x333, 0x222}}));
}

// A block a tier holds keeps its tokens however many blocks are noted since (more than the
// memo's bound, the tiers' 24 blocks), so that its offload is published with them.
TEST_F(KvEvents, HeldBlocksKeepTheirTokens) {
  create(config());
  subscribe(endpoint_);
  uint64_t seq = sync();
  const std::vector<uint32_t> t = {41, 42, 43, 44};
  const uint64_t h = hashes(t)[0];
  ASSERT_EQ(kvt_manager_note_tokens(m_, &h, 1, t.data()), KVT_OK);
  kvt_block b;
  ASSERT_EQ(kvt_block_alloc(&b, 1, m_, KVT_TIER_G1), KVT_OK);
  ASSERT_EQ(kvt_block_register_hash(&b, m_, b, h, 0), KVT_OK);
  std::vector<Block> v = flat(receive(&seq, 1));
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].tokens, t);
  // Other requests note many blocks, most never stored.
  std::vector<uint32_t> other(100 * kPage);
  for (size_t i = 0; i < other.size(); ++i) other[i] = uint32_t(1000 + i);
  const std::vector<uint64_t> ho = hashes(other);
  ASSERT_EQ(kvt_manager_note_tokens(m_, ho.data(), ho.size(), other.data()), KVT_OK);
  ASSERT_NO_FATAL_FAILURE(offload(&b, 1, KVT_TIER_G2));
  v = flat(receive(&seq, 1));
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].medium, "CPU");
  EXPECT_EQ(v[0].tokens, t) << "the offload's BlockStored lost the tokens of a block G1 holds";
  // Once no tier holds it, it is forgotten like any noted block.
  ASSERT_EQ(kvt_block_release(m_, &b, 1), KVT_OK);
  ASSERT_EQ(kvt_manager_reset(m_, 0), KVT_OK);
  receive(&seq, 3);  // G1's and G2's BlockRemoved, AllBlocksCleared
  ASSERT_EQ(kvt_manager_note_tokens(m_, ho.data(), ho.size(), other.data()), KVT_OK);
  ASSERT_EQ(kvt_block_alloc(&b, 1, m_, KVT_TIER_G1), KVT_OK);
  ASSERT_EQ(kvt_block_register_hash(&b, m_, b, h, 0), KVT_OK);
  v = flat(receive(&seq, 1));
  ASSERT_EQ(v.size(), 1u);
  EXPECT_TRUE(v[0].tokens.empty());
}

using kvt::pub::replay_stats;
using kvt::pub::ReplayStats;

const kvt::KvSink &publisher_of(kvt_manager *m) { return *m->impl->kv_sink(); }

// kvtier's snapshot (docs/KV_EVENTS.md, Snapshots): every block of every tier, each chain in
// as few BlockStored as its shape allows, all numbered with the seq the next live batch
// has; then END_SEQ.
TEST_F(KvEvents, ASnapshotHoldsEveryBlockNumberedWithTheNextSeq) {
  create(config());
  subscribe(endpoint_);
  uint64_t seq = sync();
  // A chain of three in G1 and a branch of two off its first block; the chain offloaded to G2.
  const uint64_t a[3] = {0xA1, 0xA2, 0xA3}, b[2] = {0xB1, 0xB2};
  kvt_block ba[3], bb[2];
  ASSERT_EQ(kvt_block_alloc(ba, 3, m_, KVT_TIER_G1), KVT_OK);
  ASSERT_EQ(kvt_block_register_hashes(ba, m_, ba, a, 3, 0), KVT_OK);
  ASSERT_EQ(kvt_block_alloc(bb, 2, m_, KVT_TIER_G1), KVT_OK);
  ASSERT_EQ(kvt_block_register_hashes(bb, m_, bb, b, 2, 0xA1), KVT_OK);
  ASSERT_NO_FATAL_FAILURE(offload(ba, 3, KVT_TIER_G2));
  receive(&seq, 8);

  const std::vector<Batch> snap = ask("KVTIER_SNAPSHOT");
  ASSERT_FALSE(snap.empty());
  std::map<std::string, std::set<std::pair<uint64_t, uint64_t>>> got;  // medium: (hash, parent)
  size_t events = 0;
  for (const Batch &bt : snap) {
    EXPECT_EQ(bt.seq, seq) << "a snapshot's messages carry the next live batch's seq";
    events += bt.events;
  }
  const std::vector<Block> v = flat(snap);
  ASSERT_EQ(v.at(0).kind, "AllBlocksCleared");
  for (size_t i = 1; i < v.size(); ++i) {
    EXPECT_EQ(v[i].kind, "BlockStored");
    EXPECT_TRUE(v[i].tokens.empty());
    got[v[i].medium].insert({v[i].hash, v[i].has_parent ? v[i].parent : 0});
  }
  using Set = std::set<std::pair<uint64_t, uint64_t>>;
  EXPECT_EQ(got["GPU"], (Set{{0xA1, 0}, {0xA2, 0xA1}, {0xA3, 0xA2}, {0xB1, 0xA1}, {0xB2, 0xB1}}));
  EXPECT_EQ(got["CPU"], (Set{{0xA1, 0}, {0xA2, 0xA1}, {0xA3, 0xA2}}));
  EXPECT_EQ(got.size(), 2u);
  EXPECT_EQ(events, 4u) << "AllBlocksCleared, then each chain in a row: two BlockStored in G1 "
                           "(the chain, its branch), one in G2";
  for (kvt_tier t : {KVT_TIER_G1, KVT_TIER_G2}) {  // what the tiers say they hold
    size_t n = 0;
    uint64_t h[8];
    ASSERT_EQ(kvt_tier_hashes(h, 8, &n, m_, t), KVT_OK);
    Set want;
    for (const auto &e : got[t == KVT_TIER_G1 ? "GPU" : "CPU"]) want.insert({e.first, 0});
    Set held;
    for (size_t i = 0; i < n; ++i) held.insert({h[i], 0});
    EXPECT_EQ(held, want);
  }
  // The stream goes on from that seq.
  kvt_block c;
  ASSERT_EQ(kvt_block_alloc(&c, 1, m_, KVT_TIER_G1), KVT_OK);
  ASSERT_EQ(kvt_block_register_hash(&c, m_, c, 0xC1, 0xB2), KVT_OK);
  const uint64_t before = seq;
  std::vector<Batch> live = receive(&seq, 1);
  ASSERT_EQ(live.size(), 1u);
  EXPECT_EQ(live[0].seq, before);
  // Asked again: within a second, while the buffer holds the batches from its number, the
  // same snapshot (its number says to go on from there, and the batch above follows);
  // later a new one, which holds that batch's block. Either is right.
  const std::vector<Batch> again = ask("KVTIER_SNAPSHOT");
  ASSERT_FALSE(again.empty());
  if (again[0].seq == before) {
    ASSERT_EQ(again.size(), snap.size());
    for (size_t i = 0; i < again.size(); ++i) EXPECT_EQ(again[i].payload, snap[i].payload);
  } else {
    EXPECT_EQ(again[0].seq, seq);
    const std::vector<Block> w = flat(again);
    EXPECT_EQ(w.size(), v.size() + 1);
    EXPECT_TRUE(std::any_of(w.begin(), w.end(), [](const Block &k) { return k.hash == 0xC1; }));
  }
  EXPECT_EQ(replay_stats(publisher_of(m_)).snapshots, 2u);
}

TEST_F(KvEvents, MalformedReplayRequestsLeaveItServing) {
  create(config());
  kvt_block b;
  ASSERT_EQ(kvt_block_alloc(&b, 1, m_, KVT_TIER_G1), KVT_OK);
  ASSERT_EQ(kvt_block_register_hash(&b, m_, b, 42, 0), KVT_OK);
  void *d = zmq_socket(ctx_, ZMQ_DEALER);
  ASSERT_EQ(zmq_connect(d, replay_.c_str()), 0);
  send_frames(d, {"", "abc"});                        // start seq of 3 bytes
  send_frames(d, {"", be64(0), "extra"});             // a frame too many
  send_frames(d, {be64(0)});                          // no delimiter
  send_frames(d, {"", std::string(100, 'x')});        // far too long
  send_frames(d, {"", std::string(1000, 'x')});       // over the size limit: disconnects
  Frames f;
  EXPECT_FALSE(recv_frames(d, &f, 300)) << "malformed requests get no answer";
  zmq_close(d);
  // A well-formed request is still served: the start's AllBlocksCleared, then the block.
  std::vector<Block> blocks;
  for (int i = 0; i < 100 && blocks.size() < 2; ++i) blocks = flat(replay_from(0));
  ASSERT_EQ(blocks.size(), 2u);
  EXPECT_EQ(blocks[0].kind, "AllBlocksCleared");
  EXPECT_EQ(blocks[1].kind, "BlockStored");
  EXPECT_EQ(blocks[1].hash, 42u);
}

TEST_F(KvEvents, ConnectsWithoutWildcardAndBindsWithOne) {
  // No wildcard: the publisher connects, here to a SUB that binds.
  void *sub = zmq_socket(ctx_, ZMQ_SUB);
  ASSERT_EQ(zmq_setsockopt(sub, ZMQ_SUBSCRIBE, "", 0), 0);
  ASSERT_EQ(zmq_bind(sub, "tcp://127.0.0.1:*"), 0);
  char ep[256];
  size_t len = sizeof ep;
  ASSERT_EQ(zmq_getsockopt(sub, ZMQ_LAST_ENDPOINT, ep, &len), 0);
  std::string port = std::string(ep).substr(std::string(ep).rfind(':') + 1);
  sub_ = sub;
  kvt_manager_config c = config();
  endpoint_ = ep;
  c.kv_events_endpoint = endpoint_.c_str();
  c.kv_events_replay_endpoint = nullptr;
  create(c);
  sync();
  kvt_manager_destroy(m_);
  m_ = nullptr;

  // The SUB's port is taken: binding there fails with ZMQ's message, as KVT_ERR_IO.
  std::string taken = "tcp://*:" + port;
  c.kv_events_endpoint = taken.c_str();
  kvt_manager *m = nullptr;
  EXPECT_EQ(kvt_manager_create(&m, &c), KVT_ERR_IO);
  EXPECT_NE(std::string(kvt_last_error()).find("kv_events_endpoint"), std::string::npos);
  EXPECT_NE(std::string(kvt_last_error()).find("in use"), std::string::npos) << kvt_last_error();
  zmq_close(sub_);
  sub_ = nullptr;

  // With a wildcard it binds: a SUB connects to it.
  port = std::to_string(free_port());
  std::string wild = "tcp://*:" + port;
  c.kv_events_endpoint = wild.c_str();
  create(c);
  subscribe("tcp://127.0.0.1:" + port, "");
  sync();
}

TEST_F(KvEvents, ConfigIsValidated) {
  kvt_manager *m = nullptr;
  auto refused = [&](kvt_manager_config c, const char *field) {
    EXPECT_EQ(kvt_manager_create(&m, &c), KVT_ERR_INVALID_ARGUMENT) << field;
    EXPECT_NE(std::string(kvt_last_error()).find(field), std::string::npos) << kvt_last_error();
  };
  kvt_manager_config c = config();
  c.kv_events_endpoint = "";
  refused(c, "kv_events_endpoint");
  c = config();
  c.kv_events_endpoint = nullptr;
  refused(c, "kv_events_replay_endpoint");
  c = config();
  c.kv_events_buffer = 0;
  refused(c, "kv_events_buffer");
  c = config();
  c.kv_events_dp_rank = -1;
  refused(c, "kv_events_dp_rank");
  c = config();
  c.kv_events_tiers = 1u << 4;
  refused(c, "kv_events_tiers");
  c = config();
  c.kv_events_format = 2;
  refused(c, "kv_events_format");
  c = config();
  c.reserved = 1;
  refused(c, "reserved");
  c = config();
  c.kv_events_endpoint = "nonsense";
  refused(c, "kv_events_endpoint");
  c = config();
  c.kv_events_endpoint = "carrier-pigeon://*:1";
  refused(c, "kv_events_endpoint");
  // Without a publisher, noting tokens is a no-op; bad arguments are refused either way.
  c = config();
  c.kv_events_endpoint = c.kv_events_replay_endpoint = nullptr;
  ASSERT_EQ(kvt_manager_create(&m, &c), KVT_OK);
  uint64_t h = 1;
  uint32_t t[kPage] = {};
  EXPECT_EQ(kvt_manager_note_tokens(m, &h, 1, t), KVT_OK);
  EXPECT_EQ(kvt_manager_note_tokens(m, &h, 1, nullptr), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(kvt_manager_note_tokens(m, nullptr, 1, t), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(kvt_manager_note_tokens(nullptr, &h, 1, t), KVT_ERR_INVALID_ARGUMENT);
  kvt_manager_destroy(m);
}

// Registers and evicts n blocks through G1 (each registration past capacity evicts one).
void churn(kvt_manager *m, uint64_t first, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    kvt_block b;
    ASSERT_EQ(kvt_block_alloc(&b, 1, m, KVT_TIER_G1), KVT_OK);
    ASSERT_EQ(kvt_block_register_hash(&b, m, b, first + i, 0), KVT_OK);
    ASSERT_EQ(kvt_block_release(m, &b, 1), KVT_OK);
  }
}

TEST_F(KvEvents, DestroySendsWhatIsPending) {
  kvt_manager_config c = config();
  c.kv_events_replay_endpoint = nullptr;
  create(c);
  subscribe(endpoint_);
  uint64_t seq = sync();
  churn(m_, 1000, 2000);
  kvt_manager_destroy(m_);  // at once: the last batches are still pending or in flight
  m_ = nullptr;
  size_t stored = 0;
  uint64_t last = 0;
  Frames f;
  while (recv_frames(sub_, &f, 2000)) {
    EXPECT_EQ(from_be64(f.at(1)), seq++);
    for (const Block &b : decode(f.at(2), 0).blocks)
      if (b.kind == "BlockStored") ++stored, last = b.hash;
  }
  EXPECT_EQ(stored, 2000u);
  EXPECT_EQ(last, 2999u);
}

// ---- Replay within its budgets (kv_events/replay_ledger.hpp)

// This process's resident memory (VmRSS), in bytes.
int64_t rss_bytes() {
  FILE *f = fopen("/proc/self/status", "r");
  if (f == nullptr) return -1;
  char line[256];
  long long kib = -1;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "VmRSS: %lld kB", &kib) == 1) break;
  fclose(f);
  return kib * 1024;
}

// Polls until done() holds or a generous deadline passes (a loaded 2-core box, sanitizers).
template <class F>
bool eventually(F done) {
  const auto deadline = Clock::now() + std::chrono::seconds(120);
  while (!done()) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

// One reply on a replay DEALER, current format: its batches (seq, payload) until the end
// marker; false without one in time.
using Kept = std::vector<std::pair<uint64_t, std::string>>;
bool read_reply(void *d, Kept *out) {
  Frames f;
  while (recv_frames(d, &f, 30000)) {
    if (f.size() != 4) {
      ADD_FAILURE() << "a reply of " << f.size() << " frames";
      return false;
    }
    if (f[2] == be64(-1)) return f[3].empty();
    out->emplace_back(from_be64(f[2]), f[3]);
  }
  return false;
}

// A replay client, closed without lingering at scope exit: a failed ASSERT must not leave
// zmq_ctx_term waiting for it. queue 1: its own queue holds one message, so that what it
// does not read stays with the publisher, in flight, as with a client that never reads.
struct Dealer {
  Dealer(void *ctx, const std::string &endpoint, int queue = 1000)
      : s(zmq_socket(ctx, ZMQ_DEALER)) {
    int zero = 0;
    EXPECT_EQ(zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero), 0);
    EXPECT_EQ(zmq_setsockopt(s, ZMQ_RCVHWM, &queue, sizeof queue), 0);
    EXPECT_EQ(zmq_connect(s, endpoint.c_str()), 0);
  }
  ~Dealer() { close(); }
  void close() {
    if (s) zmq_close(s);
    s = nullptr;
  }
  void *s;
};

// `batches` registrations of `blocks` blocks each, with their tokens (5 bytes each in
// msgpack): batches of some 260 KiB. Returns once the publisher keeps every batch it sent.
void KvEvents::keep_big_batches(size_t batches, size_t blocks) {
  kvt_manager_config c = config();
  c.g1_blocks = batches * blocks;
  c.g2_blocks = 0;
  create(c);
  subscribe(endpoint_);
  uint64_t seq = sync();
  std::vector<uint64_t> h(blocks);
  std::vector<uint32_t> t(blocks * kPage);
  std::vector<kvt_block> b(blocks);
  for (size_t k = 0; k < batches; ++k) {
    for (size_t i = 0; i < blocks; ++i) h[i] = (k + 1) << 32 | i;
    for (size_t i = 0; i < t.size(); ++i) t[i] = uint32_t(1u << 20 | (k * t.size() + i));
    ASSERT_EQ(kvt_manager_note_tokens(m_, h.data(), blocks, t.data()), KVT_OK);
    ASSERT_EQ(kvt_block_alloc(b.data(), blocks, m_, KVT_TIER_G1), KVT_OK);
    ASSERT_EQ(kvt_block_register_hashes(b.data(), m_, b.data(), h.data(), blocks, 0), KVT_OK);
  }
  receive(&seq, batches * blocks);
  const kvt::KvSink &p = publisher_of(m_);
  ASSERT_TRUE(eventually([&] { return replay_stats(p).kept_batches == seq; }));
  ASSERT_GT(replay_stats(p).client_budget, batches * blocks * kPage * 5);
}

// A client that reads gets every kept batch, the bytes published, then END_SEQ; again on a
// second request once it read the first; and nothing stays counted in flight.
TEST_F(KvEvents, ReplayOfSeveralMiBComesWholeToAClientThatReads) {
  keep_big_batches(4, 9000);
  const kvt::KvSink &p = publisher_of(m_);
  const ReplayStats s0 = replay_stats(p);
  Dealer d(ctx_, replay_);
  for (int round = 0; round < 2; ++round) {
    send_frames(d.s, {"", be64(0)});
    Kept all;
    ASSERT_TRUE(read_reply(d.s, &all)) << "no end marker";
    ASSERT_EQ(all.size(), s0.kept_batches);
    for (size_t i = 0; i < all.size(); ++i) EXPECT_EQ(all[i].first, i);
    for (const Batch &x : seen_) EXPECT_EQ(all.at(x.seq).second, x.payload);
  }
  d.close();
  const ReplayStats s = replay_stats(p);
  EXPECT_EQ(s.full - s0.full, 2u);
  EXPECT_EQ(s.cut, s0.cut);
  EXPECT_EQ(s.dropped, s0.dropped);
  EXPECT_TRUE(eventually([&] { return replay_stats(p).bytes == 0; }));
}

// Issue 24, finding 2: each replay request queued a copy of every kept batch, and a client
// that never reads let them pile up (300 requests: 412 MiB). Now replies share the kept
// batches, and a client holds at most kMaxRepliesPerClient replies and one full replay's
// bytes in flight: the rest of the flood is dropped. The old code grew by some 200 MiB here
// (200 requests x 4 batches of 260 KiB, copied into ZMQ's queue for the client).
TEST_F(KvEvents, ReplayFloodFromAClientThatNeverReadsStaysWithinItsBudget) {
  keep_big_batches(4, 9000);
  const kvt::KvSink &p = publisher_of(m_);
  const ReplayStats s0 = replay_stats(p);
  const int64_t rss0 = rss_bytes();
  ASSERT_GT(rss0, 0);
  Dealer d(ctx_, replay_, 1);
  constexpr uint64_t kRequests = 200;
  for (uint64_t i = 0; i < kRequests; ++i) send_frames(d.s, {"", be64(0)});
  ASSERT_TRUE(eventually([&] { return replay_stats(p).requests >= s0.requests + kRequests; }));
  const ReplayStats s = replay_stats(p);
  const int64_t grew = rss_bytes() - rss0;
  EXPECT_EQ(s.full + s.cut + s.dropped - s0.full - s0.cut - s0.dropped, kRequests);
  EXPECT_GE(s.dropped - s0.dropped, kRequests - 2 * kvt::pub::kMaxRepliesPerClient);
  EXPECT_LE(s.peak_client_bytes, s.client_budget);
  EXPECT_LE(s.peak_bytes, s.total_budget);
  EXPECT_GT(s.bytes, 0u) << "what the client did not read is still in flight";
  EXPECT_LE(s.bytes, s.client_budget);
  EXPECT_LT(grew, int64_t{32} << 20) << "resident memory grew by " << (grew >> 20) << " MiB";
  // Gone, the client's messages are freed, and the count comes back to exactly 0.
  d.close();
  EXPECT_TRUE(eventually([&] { return replay_stats(p).bytes == 0; }));
}

// Three requests before reading: the first is answered in full, the second only with what
// the client's budget has left while the first is in flight (at least END_SEQ), the third
// not at all (kMaxRepliesPerClient). Once read, a fourth is answered in full and comes next.
TEST_F(KvEvents, ReplayRequestsWhileOneIsInFlightAreLimited) {
  keep_big_batches(4, 9000);
  const kvt::KvSink &p = publisher_of(m_);
  const ReplayStats s0 = replay_stats(p);
  Dealer d(ctx_, replay_, 1);
  for (int i = 0; i < 3; ++i) send_frames(d.s, {"", be64(0)});
  ASSERT_TRUE(eventually([&] { return replay_stats(p).requests == s0.requests + 3; }));
  ReplayStats s = replay_stats(p);
  EXPECT_EQ(s.full - s0.full, 1u);
  EXPECT_EQ(s.cut - s0.cut, 1u);
  EXPECT_EQ(s.dropped - s0.dropped, 1u);
  EXPECT_LE(s.peak_client_bytes, s.client_budget);
  Kept first, second, fourth;
  ASSERT_TRUE(read_reply(d.s, &first));
  EXPECT_EQ(first.size(), s0.kept_batches);
  ASSERT_TRUE(read_reply(d.s, &second)) << "the second request got no end marker";
  EXPECT_LT(second.size(), s0.kept_batches) << "the second reply was not cut";
  for (size_t i = 0; i < second.size(); ++i) EXPECT_EQ(second[i].first, i);
  const uint64_t last = s0.kept_batches - 1;
  send_frames(d.s, {"", be64(int64_t(last))});
  ASSERT_TRUE(read_reply(d.s, &fourth)) << "the third request was answered, or the fourth not";
  ASSERT_EQ(fourth.size(), 1u);
  EXPECT_EQ(fourth[0].first, last);
  EXPECT_EQ(replay_stats(p).full - s0.full, 2u);
  d.close();
  EXPECT_TRUE(eventually([&] { return replay_stats(p).bytes == 0; }));
}

// ---- The PUB socket within its budget (kv_events/send_ledger.hpp)

using kvt::pub::send_stats;
using kvt::pub::SendStats;

#ifdef __SANITIZE_ADDRESS__
constexpr bool kAsan = true;
#else
constexpr bool kAsan = false;
#endif

// Issue 24: ZMQ's high-water mark counts messages, so a subscriber that never read let the
// PUB socket hold 100,000 batches for it, whatever their size. Now what ZMQ holds is counted
// in bytes, and past kSendBudgetBytes batches are not sent (a gap in seq): a subscriber that
// reads gets every batch that was sent. Once the one that does not read is gone, what it held
// comes back and publishing goes on. The old code grew by each batch until the end of this
// test's 400 rounds (some 500 MiB).
TEST_F(KvEvents, ASubscriberThatNeverReadsPinsAtMostTheSendBudget) {
  constexpr uint32_t kBigPage = 4096;  // tokens per block: 20 KiB each in msgpack
  constexpr size_t kBlocks = 64;       // per round, and so per batch: some 1.3 MiB
  kvt_manager_config c = config();
  c.page_size = kBigPage;
  c.chunk_bytes = 0;
  c.g1_blocks = 4 * kBlocks;
  c.g2_blocks = 0;
  c.kv_events_replay_endpoint = nullptr;
  create(c);
  // Closed however the test ends: an open socket would hold TearDown's zmq_ctx_term.
  std::unique_ptr<void, int (*)(void *)> stuck_socket(zmq_socket(ctx_, ZMQ_SUB), zmq_close);
  void *stuck = stuck_socket.get();
  int one = 1, zero = 0;
  ASSERT_EQ(zmq_setsockopt(stuck, ZMQ_RCVHWM, &one, sizeof one), 0);
  ASSERT_EQ(zmq_setsockopt(stuck, ZMQ_LINGER, &zero, sizeof zero), 0);
  ASSERT_EQ(zmq_setsockopt(stuck, ZMQ_SUBSCRIBE, "", 0), 0);
  ASSERT_EQ(zmq_connect(stuck, endpoint_.c_str()), 0);
  Frames f;
  bool subscribed = false;  // once it received a message; from then on it reads nothing
  for (int i = 0; i < 600 && !subscribed; ++i) {
    ASSERT_EQ(kvt_manager_reset(m_, 0), KVT_OK);
    subscribed = recv_frames(stuck, &f, 100);
  }
  ASSERT_TRUE(subscribed);
  subscribe(endpoint_);
  const uint64_t first = sync();

  // The subscriber that reads, on its own thread; stopped and joined however the test ends.
  struct Reader {
    std::atomic<bool> stop{false};
    std::atomic<uint64_t> read{0}, next, gaps{0};
    std::thread thread;
    Reader(void *sub, uint64_t first) : next(first) {
      thread = std::thread([this, sub] {
        Frames g;
        while (!stop.load())
          if (recv_frames(sub, &g, 100)) {
            const uint64_t seq = from_be64(g.at(1));
            gaps += seq != next.load();
            next = seq + 1;
            ++read;
          }
      });
    }
    ~Reader() {
      stop = true;
      thread.join();
    }
  } reader(sub_, first);
  std::atomic<uint64_t> &read = reader.read, &gaps = reader.gaps;
  const kvt::KvSink &p = publisher_of(m_);
  const SendStats s0 = send_stats(p);
  const int64_t rss0 = rss_bytes();
  std::vector<uint64_t> h(kBlocks);
  std::vector<uint32_t> t(kBlocks * kBigPage);
  std::vector<kvt_block> b(kBlocks);
  uint64_t round = 0;
  auto publish_round = [&] {
    for (size_t i = 0; i < kBlocks; ++i) h[i] = (round + 1) << 32 | i;
    for (size_t i = 0; i < t.size(); ++i) t[i] = uint32_t(1u << 20 | (round * t.size() + i));
    ++round;
    ASSERT_EQ(kvt_manager_note_tokens(m_, h.data(), kBlocks, t.data()), KVT_OK);
    ASSERT_EQ(kvt_block_alloc(b.data(), kBlocks, m_, KVT_TIER_G1), KVT_OK);
    ASSERT_EQ(kvt_block_register_hashes(b.data(), m_, b.data(), h.data(), kBlocks, 0), KVT_OK);
    ASSERT_EQ(kvt_block_release(m_, b.data(), kBlocks), KVT_OK);
  };
  // A round at a time: each in its own batches, sent or skipped, and read when sent (the
  // reader's own queue is in this process too).
  auto batches = [&] { return send_stats(p).sent + send_stats(p).skipped - s0.sent - s0.skipped; };
  auto all_read = [&] { return read.load() == send_stats(p).sent - s0.sent; };
  // A round may be one batch or two (its removals, then its stores): the publisher's thread
  // has taken all of it once it is idle.
  auto round_done = [&] { return batches() >= round && kvt::pub::publisher_idle(p); };
  while (round < 400 && send_stats(p).skipped < s0.skipped + 3) {
    publish_round();
    ASSERT_TRUE(eventually(round_done));
    ASSERT_TRUE(eventually(all_read)) << "the reader did not get every batch sent";
  }
  const SendStats s = send_stats(p);
  const int64_t grew = rss_bytes() - rss0;
  EXPECT_GE(s.skipped - s0.skipped, 3u) << "the budget was never reached";
  EXPECT_LE(s.peak_bytes, s.budget);
  EXPECT_GT(s.bytes, s.budget / 2) << "what the stuck subscriber did not read is held";
  if (!kAsan) {  // ASan keeps freed memory in its quarantine (256 MiB): RSS says nothing there
    EXPECT_LT(grew, int64_t(s.budget + (48 << 20))) << "grew by " << (grew >> 20) << " MiB";
  }

  // Once the subscriber that reads nothing is gone, what it held comes back, and the next
  // batches go out.
  stuck_socket.reset();
  EXPECT_TRUE(eventually([&] { return send_stats(p).bytes == 0; }))
      << send_stats(p).bytes << " bytes still held";
  const uint64_t sent_before = send_stats(p).sent, gaps_before = gaps.load();
  for (uint64_t i = 1; i <= 3; ++i) {
    publish_round();
    ASSERT_TRUE(eventually([&] { return send_stats(p).sent >= sent_before + i; }));
    ASSERT_TRUE(eventually(round_done));
  }
  EXPECT_TRUE(eventually(all_read));
  EXPECT_EQ(send_stats(p).skipped, s.skipped);
  // Skipped batches are gaps the reader saw; the batches after the recovery come in a run,
  // after at most one more (the batches skipped last).
  EXPECT_GE(gaps.load(), 1u);
  EXPECT_LE(gaps.load(), gaps_before + 1);
}

}  // namespace

// A subscriber that never reads, and one that is absent: the calls never wait for them,
// and destroy (which sends what is pending) still ends.
TEST(Threads, KvEventsSlowOrAbsentSubscriberNeverBlocks) {
  std::string dir = temp_dir();
  std::string ep = "ipc://" + dir + "/pub";
  void *ctx = zmq_ctx_new();
  void *sub = zmq_socket(ctx, ZMQ_SUB);
  int one = 1;
  zmq_setsockopt(sub, ZMQ_RCVHWM, &one, sizeof one);
  zmq_setsockopt(sub, ZMQ_SUBSCRIBE, "", 0);
  for (const char *target : {"slow", "absent"}) {
    kvt_manager_config c;
    kvt_manager_config_init(&c);
    c.page_size = kPage;
    c.chunk_bytes = 0;
    c.g1_blocks = 64;
    c.g2_blocks = 0;
    std::string endpoint = std::string(target) == "slow" ? ep : "tcp://127.0.0.1:9";
    c.kv_events_endpoint = endpoint.c_str();  // "absent": connects to the discard port
    kvt_manager *m = nullptr;
    ASSERT_EQ(kvt_manager_create(&m, &c), KVT_OK);
    if (std::string(target) == "slow") {
      ASSERT_EQ(zmq_connect(sub, ep.c_str()), 0);
    }
    auto t0 = Clock::now();
    std::thread other([&] { churn(m, 1u << 30, 2000); });
    churn(m, 1, 2000);
    other.join();
    auto t1 = Clock::now();
    kvt_manager_destroy(m);
    auto t2 = Clock::now();
    EXPECT_LT(std::chrono::duration<double>(t1 - t0).count(), 60.0) << target;
    EXPECT_LT(std::chrono::duration<double>(t2 - t1).count(), 10.0) << target;
  }
  zmq_close(sub);
  zmq_ctx_term(ctx);
  std::string rm = "rm -rf " + dir;
  ASSERT_EQ(system(rm.c_str()), 0);
}
