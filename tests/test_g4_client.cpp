// G4's client (src/remote) against a real redis-server (tests/redis_server.hpp): byte-exact
// round trips, misses, corrupt and foreign values, a server killed and restarted, eviction
// at maxmemory, two shards, AUTH, bad URLs, and threads.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/error.hpp"
#include "redis_server.hpp"
#include "remote/key.hpp"
#include "remote/store.hpp"
#include "remote/value_codec.hpp"

namespace {

using kvt::remote::Get;
using kvt::remote::Put;
using kvt::remote::Store;
using kvt_test::RedisServer;
using Clock = std::chrono::steady_clock;

// The client is compiled into this program: its messages are in this program's copy of
// kvt::last_error(), not the library's kvt_last_error().
std::string err() { return kvt::last_error(); }

constexpr uint64_t kLayout = 0x1a7047;

// The fixture itself: a value survives until the kill, the restart is empty and answers
// on the same port.
TEST(G4Redis, FixtureKillRestart) {
  RedisServer redis;
  ASSERT_TRUE(redis.start({.unix_socket = true}));
  auto r = redis.command({"SET", "k", std::string("a\0b", 3)});
  ASSERT_TRUE(r);
  EXPECT_EQ(redis.integer({"EXISTS", "k"}), 1);
  EXPECT_TRUE(std::filesystem::exists(redis.socket_path()));
  int port = redis.port();
  redis.kill9();
  EXPECT_EQ(redis.command({"PING"}), nullptr);
  ASSERT_TRUE(redis.restart());
  EXPECT_EQ(redis.port(), port);
  EXPECT_EQ(redis.integer({"EXISTS", "k"}), 0);
}

kvt::remote::Config config(const std::string &urls, uint64_t ns = 7, uint64_t layout = kLayout,
                           uint64_t timeout_us = 1000000) {
  kvt::remote::Config c;
  c.key_prefix = "kvtier";
  c.ns = ns;
  c.layout = layout;
  c.timeout_us = timeout_us;
  for (size_t at = 0;;) {
    size_t comma = urls.find(',', at);
    c.urls.push_back(urls.substr(at, comma == std::string::npos ? comma : comma - at));
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return c;
}

std::unique_ptr<Store> make_store(const kvt::remote::Config &c) {
  std::unique_ptr<Store> s;
  kvt_status st = Store::create(&s, c);
  EXPECT_EQ(st, KVT_OK) << err();
  return s;
}

// n blocks of len bytes each, every byte a function of (block, offset, seed).
struct Blocks {
  size_t len;
  std::vector<uint64_t> hashes;
  std::vector<std::vector<uint8_t>> data;
  Blocks(size_t n, size_t len, uint64_t seed) : len(len) {
    std::mt19937_64 rng(seed);
    for (size_t i = 0; i < n; ++i) {
      hashes.push_back(rng() | 1);
      std::vector<uint8_t> d(len);
      for (size_t k = 0; k < len; k += 8) {  // 8 bytes a draw: big batches stay quick
        uint64_t r = rng();
        std::memcpy(d.data() + k, &r, std::min<size_t>(8, len - k));
      }
      data.push_back(std::move(d));
    }
  }
  uint64_t parent(size_t i) const { return i == 0 ? 0 : hashes[i - 1]; }
  std::vector<Put> puts() const {
    std::vector<Put> p;
    for (size_t i = 0; i < hashes.size(); ++i) p.push_back({hashes[i], parent(i), data[i].data(), len});
    return p;
  }
  // Puts every block, expecting each to succeed.
  void put(Store &s) const {
    auto p = puts();
    std::vector<kvt_status> st(p.size(), KVT_ERR_STATE);
    s.put(p.data(), p.size(), st.data());
    for (size_t i = 0; i < st.size(); ++i) ASSERT_EQ(st[i], KVT_OK) << i << ": " << err();
  }
  // Reads every block into fresh buffers: the statuses, and out[i] holds what was read.
  std::vector<kvt_status> get(Store &s, std::vector<std::vector<uint8_t>> *out = nullptr) const {
    std::vector<std::vector<uint8_t>> buf(hashes.size(), std::vector<uint8_t>(len, 0xee));
    std::vector<Get> g;
    for (size_t i = 0; i < hashes.size(); ++i) g.push_back({hashes[i], parent(i), buf[i].data(), len});
    s.get(g.data(), g.size());
    std::vector<kvt_status> st;
    for (auto &x : g) st.push_back(x.status);
    if (out) *out = std::move(buf);
    return st;
  }
};

std::string key_of(uint64_t hash, uint64_t ns = 7, uint64_t layout = kLayout) {
  return kvt::remote::KeySpace{"kvtier", ns, layout}.key(hash);
}

// A keyed config (g4_key_env) of namespace ns, its key's 64 hex digits set in the
// variable env.
kvt::remote::Config keyed(const std::string &url, const char *env, const char *hex,
                          uint64_t ns = 7) {
  setenv(env, hex, 1);
  kvt_manager_config c;
  kvt_manager_config_init(&c);
  c.g4_url = url.c_str();
  c.g4_namespace = ns;
  c.g4_key_env = env;
  kvt::remote::Config rc;
  EXPECT_EQ(kvt::remote::parse_config(&rc, c, kLayout), KVT_OK) << err();
  unsetenv(env);
  return rc;
}

kvt_g4_stats stats_of(const Store &s) {
  kvt_g4_stats st{};
  s.stats(&st);
  return st;
}

TEST(G4Client, RoundTripIsByteExact) {
  RedisServer redis;
  ASSERT_TRUE(redis.start());
  auto store = make_store(config(redis.url()));
  Blocks b(16, 32 * 1024 + 3, 1);
  b.put(*store);
  std::vector<std::vector<uint8_t>> got;
  auto st = b.get(*store, &got);
  for (size_t i = 0; i < st.size(); ++i) {
    EXPECT_EQ(st[i], KVT_OK) << i;
    EXPECT_EQ(got[i], b.data[i]) << i;
  }
  EXPECT_EQ(redis.integer({"DBSIZE"}), 16);
  // The key format of docs/G4.md, and the value's size: 64-byte header + the block.
  EXPECT_EQ(key_of(b.hashes[0]).size(), 57u);
  EXPECT_EQ(redis.integer({"STRLEN", key_of(b.hashes[0])}), int64_t(64 + b.len));
  kvt_g4_stats s = stats_of(*store);
  EXPECT_EQ(s.shards, 1u);
  EXPECT_EQ(s.stored_blocks, 16u);
  EXPECT_EQ(s.loaded_blocks, 16u);
  EXPECT_EQ(s.bytes_written, 16u * b.len);
  EXPECT_EQ(s.bytes_read, 16u * b.len);
  EXPECT_EQ(s.round_trips, 2u);  // one pipelined round trip per batch
}

TEST(G4Client, UnixSocketAndDatabase) {
  RedisServer redis;
  ASSERT_TRUE(redis.start({.unix_socket = true}));
  auto store = make_store(config(redis.unix_url() + "?db=3"));
  Blocks b(3, 100, 2);
  b.put(*store);
  EXPECT_EQ(redis.integer({"DBSIZE"}), 0);  // database 0 is untouched
  auto r = redis.command({"INFO", "keyspace"});
  ASSERT_TRUE(r);
  EXPECT_NE(std::string(r->str, r->len).find("db3:keys=3"), std::string::npos);
  std::vector<std::vector<uint8_t>> got;
  EXPECT_EQ(b.get(*store, &got), std::vector<kvt_status>(3, KVT_OK));
  EXPECT_EQ(got, b.data);
}

TEST(G4Client, ExistsPrefixAndMisses) {
  RedisServer redis;
  ASSERT_TRUE(redis.start());
  auto store = make_store(config(redis.url()));
  Blocks b(8, 256, 3);
  size_t n = 99;
  ASSERT_EQ(store->exists_prefix(&n, b.hashes.data(), 8), KVT_OK) << err();
  EXPECT_EQ(n, 0u);
  b.put(*store);
  ASSERT_EQ(store->exists_prefix(&n, b.hashes.data(), 8), KVT_OK);
  EXPECT_EQ(n, 8u);
  ASSERT_EQ(redis.integer({"DEL", key_of(b.hashes[5])}), 1);
  ASSERT_EQ(store->exists_prefix(&n, b.hashes.data(), 8), KVT_OK);
  EXPECT_EQ(n, 5u);  // 6 and 7 exist but follow a hole
  auto st = b.get(*store);
  EXPECT_EQ(st[5], KVT_ERR_NOT_FOUND);
  EXPECT_EQ(st[4], KVT_OK);
  EXPECT_EQ(st[6], KVT_OK);
  kvt_g4_stats s = stats_of(*store);
  EXPECT_EQ(s.lookups, 24u);
  EXPECT_EQ(s.hits, 13u);
  EXPECT_EQ(s.missing_blocks, 1u);
}

// A value overwritten with garbage, a truncated one, one with a flipped payload byte and one
// of another parent: each is CORRUPT, its key is deleted, and the buffer is not written.
TEST(G4Client, GarbageIsCorruptAndDeleted) {
  RedisServer redis;
  ASSERT_TRUE(redis.start());
  auto store = make_store(config(redis.url()));
  Blocks b(5, 4096, 4);
  b.put(*store);
  ASSERT_TRUE(redis.command({"SET", key_of(b.hashes[0]), "garbage"}));
  auto v = redis.command({"GET", key_of(b.hashes[1])});
  ASSERT_TRUE(v && v->type == REDIS_REPLY_STRING);
  std::string val(v->str, v->len);
  ASSERT_TRUE(redis.command({"SET", key_of(b.hashes[1]), val.substr(0, val.size() - 1)}));
  std::string flipped = val;
  flipped[100] ^= 1;
  ASSERT_TRUE(redis.command({"SET", key_of(b.hashes[2]), flipped}));
  // Block 3's valid value under block 4's key: another hash and parent.
  auto v3 = redis.command({"GET", key_of(b.hashes[3])});
  ASSERT_TRUE(redis.command({"SET", key_of(b.hashes[4]), std::string(v3->str, v3->len)}));

  std::vector<std::vector<uint8_t>> got;
  auto st = b.get(*store, &got);
  for (size_t i = 0; i < 5; ++i) {
    if (i == 3) continue;
    EXPECT_EQ(st[i], KVT_ERR_CORRUPT) << i;
    // A value of the block's size is read in place and then refused (its bytes are not the
    // block's: the status says so); one of another size is never read into the block.
    if (i < 2) {
      EXPECT_EQ(got[i], std::vector<uint8_t>(b.len, 0xee)) << i;
    }
    EXPECT_EQ(redis.integer({"EXISTS", key_of(b.hashes[i])}), 0) << i;
  }
  EXPECT_EQ(st[3], KVT_OK);
  EXPECT_EQ(got[3], b.data[3]);
  EXPECT_EQ(stats_of(*store).corrupt_blocks, 4u);
  // Now a plain miss.
  EXPECT_EQ(b.get(*store)[0], KVT_ERR_NOT_FOUND);
}

// Other namespaces and layouts build other keys: never seen. A value of another namespace or
// layout copied under this one's key fails the header.
TEST(G4Client, ForeignNamespaceAndLayout) {
  RedisServer redis;
  ASSERT_TRUE(redis.start());
  auto mine = make_store(config(redis.url(), 7, kLayout));
  auto other_ns = make_store(config(redis.url(), 8, kLayout));
  auto other_layout = make_store(config(redis.url(), 7, kLayout + 1));
  Blocks b(4, 512, 5);
  b.put(*other_ns);
  b.put(*other_layout);
  size_t n = 9;
  ASSERT_EQ(mine->exists_prefix(&n, b.hashes.data(), 4), KVT_OK);
  EXPECT_EQ(n, 0u);
  EXPECT_EQ(b.get(*mine), std::vector<kvt_status>(4, KVT_ERR_NOT_FOUND));
  auto a = redis.command({"GET", key_of(b.hashes[0], 8, kLayout)});
  auto l = redis.command({"GET", key_of(b.hashes[1], 7, kLayout + 1)});
  ASSERT_TRUE(redis.command({"SET", key_of(b.hashes[0]), std::string(a->str, a->len)}));
  ASSERT_TRUE(redis.command({"SET", key_of(b.hashes[1]), std::string(l->str, l->len)}));
  auto st = b.get(*mine);
  EXPECT_EQ(st[0], KVT_ERR_CORRUPT);
  EXPECT_EQ(st[1], KVT_ERR_CORRUPT);
  // The others still read their own.
  EXPECT_EQ(b.get(*other_ns), std::vector<kvt_status>(4, KVT_OK));
}

// A block of another length than the reader's (another geometry with the same layout id
// cannot happen, but a bad caller can): CORRUPT, not a short copy.
TEST(G4Client, WrongLengthIsCorrupt) {
  RedisServer redis;
  ASSERT_TRUE(redis.start());
  auto store = make_store(config(redis.url()));
  Blocks b(1, 1000, 6);
  b.put(*store);
  Blocks shorter = b;
  shorter.len = 999;
  EXPECT_EQ(shorter.get(*store)[0], KVT_ERR_CORRUPT);
}

// kill -9 while a big pipelined put runs on another thread: that put and the calls during
// the outage fail with KVT_ERR_IO within the timeout, never hang; after the restart the next
// call reconnects and works.
TEST(G4Client, KilledMidBatchThenRestarted) {
  RedisServer redis;
  ASSERT_TRUE(redis.start());
  auto store = make_store(config(redis.url(), 7, kLayout, 500000));
  Blocks warm(1, 64, 7);
  warm.put(*store);  // connected
  Blocks big(32, 2 << 20, 8);  // 64 MiB in one pipelined batch
  auto puts = big.puts();
  std::vector<kvt_status> st(puts.size(), KVT_ERR_STATE);
  Clock::time_point t0 = Clock::now();
  std::thread killer([&] {  // once Redis has read 8 MiB of the batch, however fast it goes
    for (auto end = Clock::now() + std::chrono::seconds(30); Clock::now() < end;) {
      auto r = redis.command({"INFO", "stats"});
      const char *f = r && r->type == REDIS_REPLY_STRING
                          ? std::strstr(r->str, "total_net_input_bytes:")
                          : nullptr;
      if (f && std::atoll(f + 22) > (8 << 20)) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    redis.kill9();
  });
  store->put(puts.data(), puts.size(), st.data());
  double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  killer.join();
  size_t io = 0;
  for (kvt_status s : st) {
    EXPECT_TRUE(s == KVT_OK || s == KVT_ERR_IO) << kvt_status_str(s);
    io += s == KVT_ERR_IO;
  }
  EXPECT_GT(io, 0u) << "the kill came after the whole batch (" << secs << " s)";
  EXPECT_LT(secs, 20.0);
  // While it is down: every call fails fast with IO.
  size_t n = 5;
  t0 = Clock::now();
  EXPECT_EQ(store->exists_prefix(&n, warm.hashes.data(), 1), KVT_ERR_IO);
  EXPECT_EQ(n, 0u);
  EXPECT_NE(err().find(std::to_string(redis.port())), std::string::npos)
      << err();
  EXPECT_EQ(warm.get(*store)[0], KVT_ERR_IO);
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 2.0);
  uint64_t failed = stats_of(*store).failed_blocks;
  EXPECT_GE(failed, io + 1);

  ASSERT_TRUE(redis.restart());
  Blocks after(4, 32 * 1024, 9);
  after.put(*store);
  std::vector<std::vector<uint8_t>> got;
  EXPECT_EQ(after.get(*store, &got), std::vector<kvt_status>(4, KVT_OK));
  EXPECT_EQ(got, after.data);
  EXPECT_EQ(warm.get(*store)[0], KVT_ERR_NOT_FOUND);  // the restart is empty
  EXPECT_GE(stats_of(*store).reconnects, 1u);
}

// A server that accepts but never answers (SIGSTOP): the call returns KVT_ERR_IO after about
// the timeout, not later.
TEST(G4Client, StalledServerTimesOut) {
  RedisServer redis;
  ASSERT_TRUE(redis.start());
  auto store = make_store(config(redis.url(), 7, kLayout, 200000));
  Blocks b(2, 64, 10);
  b.put(*store);
  ::kill(redis.pid(), SIGSTOP);
  Clock::time_point t0 = Clock::now();
  auto st = b.get(*store);
  double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  ::kill(redis.pid(), SIGCONT);
  EXPECT_EQ(st, std::vector<kvt_status>(2, KVT_ERR_IO));
  EXPECT_GE(secs, 0.15);
  EXPECT_LT(secs, 2.0);
  EXPECT_NE(err().find("timed out"), std::string::npos)
      << err();
  // Resumed: the next call reconnects (the stalled connection was dropped) and reads.
  EXPECT_EQ(b.get(*store), std::vector<kvt_status>(2, KVT_OK));
}

// maxmemory 4 MiB with allkeys-lru: writing 12 MiB evicts the oldest values, which read as
// misses; every put succeeds; the newest values read back exact.
TEST(G4Client, MaxmemoryEvictsOldKeys) {
  RedisServer redis;
  ASSERT_TRUE(redis.start({.maxmemory = "4mb", .policy = "allkeys-lru"}));
  auto store = make_store(config(redis.url()));
  Blocks b(96, 128 * 1024, 11);
  auto puts = b.puts();
  for (size_t at = 0; at < puts.size(); at += 8) {  // batches of 8, oldest first
    std::vector<kvt_status> st(8, KVT_ERR_STATE);
    store->put(puts.data() + at, 8, st.data());
    EXPECT_EQ(st, std::vector<kvt_status>(8, KVT_OK)) << at << ": " << err();
  }
  std::vector<std::vector<uint8_t>> got;
  auto st = b.get(*store, &got);
  size_t ok = 0;
  for (size_t i = 0; i < st.size(); ++i) {
    ASSERT_TRUE(st[i] == KVT_OK || st[i] == KVT_ERR_NOT_FOUND) << kvt_status_str(st[i]);
    if (st[i] == KVT_OK) {
      ++ok;
      EXPECT_EQ(got[i], b.data[i]);
    }
  }
  // Which keys stay is Redis's business: its LRU is approximate (the oldest of a few sampled
  // keys), and the reads above evict too, since their replies count against maxmemory
  // (the newest keys, read last, may go then: seen once on a 16-core machine). What holds:
  // the older half mostly went while it was written over.
  EXPECT_LT(size_t(std::count(st.begin(), st.begin() + 48, KVT_OK)), 8u);
  EXPECT_GT(ok, 0u);
  EXPECT_LT(ok, 40u);  // 4 MiB holds fewer than 32 of these
  auto info = redis.command({"INFO", "stats"});
  EXPECT_NE(std::string(info->str, info->len).find("evicted_keys:"), std::string::npos);
}

// maxmemory with noeviction: Redis refuses SET with an OOM error once full; those puts fail
// cleanly with KVT_ERR_IO naming the refusal, and reads still work.
TEST(G4Client, MaxmemoryNoevictionRefusesCleanly) {
  RedisServer redis;
  ASSERT_TRUE(redis.start({.maxmemory = "2mb", .policy = "noeviction"}));
  auto store = make_store(config(redis.url()));
  Blocks b(48, 128 * 1024, 12);
  auto puts = b.puts();
  std::vector<kvt_status> st(puts.size(), KVT_ERR_STATE);
  for (size_t at = 0; at < puts.size(); at += 4) store->put(puts.data() + at, 4, st.data() + at);
  size_t ok = 0, io = 0;
  for (kvt_status s : st) ok += s == KVT_OK, io += s == KVT_ERR_IO;
  EXPECT_EQ(ok + io, st.size());
  EXPECT_GT(ok, 0u);
  EXPECT_GT(io, 0u);
  EXPECT_NE(err().find("OOM"), std::string::npos) << err();
  auto got = b.get(*store);
  EXPECT_EQ(got[0], KVT_OK);
  EXPECT_EQ(got.back(), KVT_ERR_NOT_FOUND);
}

TEST(G4Client, TwoShardsSpreadAndFailAlone) {
  RedisServer a, b;
  ASSERT_TRUE(a.start());
  ASSERT_TRUE(b.start({.unix_socket = true}));
  auto store = make_store(config(a.url() + "," + b.unix_url()));
  EXPECT_EQ(stats_of(*store).shards, 2u);
  Blocks blk(200, 256, 13);
  blk.put(*store);
  long long na = a.integer({"DBSIZE"}), nb = b.integer({"DBSIZE"});
  EXPECT_EQ(na + nb, 200);
  EXPECT_GT(na, 50);  // 160 virtual nodes each: close to half
  EXPECT_GT(nb, 50);
  EXPECT_EQ(stats_of(*store).round_trips, 2u);  // one per shard
  std::vector<std::vector<uint8_t>> got;
  EXPECT_EQ(blk.get(*store, &got), std::vector<kvt_status>(200, KVT_OK));
  EXPECT_EQ(got, blk.data);
  // The same shards listed the other way round place every key the same.
  auto reversed = make_store(config(b.unix_url() + "," + a.url()));
  EXPECT_EQ(blk.get(*reversed), std::vector<kvt_status>(200, KVT_OK));

  b.kill9();
  auto st = blk.get(*store);
  size_t ok = 0;
  for (size_t i = 0; i < st.size(); ++i) {
    bool on_a = a.integer({"EXISTS", key_of(blk.hashes[i])}) == 1;
    EXPECT_EQ(st[i], on_a ? KVT_OK : KVT_ERR_IO) << i;
    ok += st[i] == KVT_OK;
  }
  EXPECT_EQ(ok, size_t(na));
  size_t n = 0;
  EXPECT_EQ(store->exists_prefix(&n, blk.hashes.data(), 200), KVT_ERR_IO);
}

// A TCP port whose connections the kernel accepts (its backlog) and nobody ever reads.
class DeafServer {
 public:
  DeafServer() {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    int small = 4096;  // inherited by its connections: full after a few pages
    setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr *>(&a), sizeof a), 0);
    EXPECT_EQ(listen(fd_, 16), 0);
    getsockname(fd_, reinterpret_cast<sockaddr *>(&a), &len);
    port_ = ntohs(a.sin_port);
  }
  ~DeafServer() { close(fd_); }
  std::string url() const { return "redis://127.0.0.1:" + std::to_string(port_); }

 private:
  int fd_ = -1, port_ = 0;
};

// A shard that stops reading (its socket full) fails its own blocks of a batch at the
// timeout, and the other shard's blocks of the same batch are written, though the stuck one
// comes first in the list.
TEST(G4Client, AShardThatStopsReadingFailsAloneInItsBatch) {
  DeafServer deaf;
  RedisServer a;
  ASSERT_TRUE(a.start());
  auto store = make_store(config(deaf.url() + "," + a.url(), 7, kLayout, 3000000));
  Blocks blk(32, 512 * 1024, 17);  // about 8 MiB per shard: more than a socket holds
  auto p = blk.puts();
  std::vector<kvt_status> st(p.size(), KVT_ERR_STATE);
  store->put(p.data(), p.size(), st.data());
  size_t on_a = 0, failed = 0;
  for (size_t i = 0; i < st.size(); ++i) {
    const bool there = a.integer({"EXISTS", key_of(blk.hashes[i])}) == 1;
    on_a += there;
    failed += st[i] == KVT_ERR_IO;
    EXPECT_EQ(st[i], there ? KVT_OK : KVT_ERR_IO) << i << ": " << err();
  }
  EXPECT_GT(on_a, 5u);
  EXPECT_GT(failed, 5u);
  EXPECT_EQ(on_a + failed, blk.hashes.size());
  EXPECT_NE(err().find("timed out"), std::string::npos) << err();
}

TEST(G4Client, AuthWithPasswordFromEnv) {
  RedisServer redis;
  ASSERT_TRUE(redis.start({.password = "s3cret pass"}));
  kvt_manager_config c;
  kvt_manager_config_init(&c);
  std::string url = redis.url();
  c.g4_url = url.c_str();
  c.g4_password_env = "KVT_TEST_G4_PASSWORD";
  kvt::remote::Config rc;
  unsetenv("KVT_TEST_G4_PASSWORD");
  EXPECT_EQ(kvt::remote::parse_config(&rc, c, kLayout), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_NE(err().find("KVT_TEST_G4_PASSWORD"), std::string::npos)
      << err();
  setenv("KVT_TEST_G4_PASSWORD", "s3cret pass", 1);
  ASSERT_EQ(kvt::remote::parse_config(&rc, c, kLayout), KVT_OK) << err();
  unsetenv("KVT_TEST_G4_PASSWORD");
  EXPECT_EQ(rc.password, "s3cret pass");
  auto store = make_store(rc);
  Blocks b(2, 64, 14);
  b.put(*store);
  EXPECT_EQ(b.get(*store), std::vector<kvt_status>(2, KVT_OK));
  // Without the password (or with a wrong one) Redis refuses: KVT_ERR_IO, named.
  rc.password.clear();
  auto anon = make_store(rc);
  EXPECT_EQ(b.get(*anon), std::vector<kvt_status>(2, KVT_ERR_IO));
  EXPECT_NE(err().find("NOAUTH"), std::string::npos) << err();
  rc.password = "wrong";
  auto wrong = make_store(rc);
  EXPECT_EQ(b.get(*wrong), std::vector<kvt_status>(2, KVT_ERR_IO));
  EXPECT_NE(err().find("AUTH refused"), std::string::npos)
      << err();
}

TEST(G4Client, ConfigAndBadUrls) {
  kvt_manager_config c;
  kvt_manager_config_init(&c);
  kvt::remote::Config rc;
  c.g4_url = "redis://10.0.0.1:7000/2, unix:///run/redis.sock?db=1,redis://cache";
  c.g4_namespace = 42;
  ASSERT_EQ(kvt::remote::parse_config(&rc, c, kLayout), KVT_OK) << err();
  EXPECT_EQ(rc.urls.size(), 3u);
  EXPECT_EQ(rc.key_prefix, "kvtier");
  EXPECT_EQ(rc.ns, 42u);
  EXPECT_EQ(rc.layout, kLayout);
  EXPECT_EQ(rc.timeout_us, c.g4_timeout_us);
  const char *bad[][2] = {
      {"", "empty entry"},
      {"redis://a:1,,redis://b:2", "empty entry"},
      {"http://host:1", "expected redis://"},
      {"rediss://host:1", "TLS"},
      {"redis://", "host is empty"},
      {"redis://:6379", "host is empty"},
      {"redis://host:", "port after ':' is empty"},
      {"redis://host:0", "port must be"},
      {"redis://host:65536", "port must be"},
      {"redis://host:12x", "port must be"},
      {"redis://host:1/abc", "database number"},
      {"redis://host:1/-1", "database number"},
      {"redis://user:pw@host:1", "g4_password_env"},
      {"redis://ho st:1", "not allowed"},
      {"redis://[::1:1", "']'"},
      {"unix://relative.sock", "absolute"},
      {"unix:///", "path is empty"},
      {"unix:///s.sock?x=1", "?db=N"},
      {"unix:///s.sock?db=z", "db must be"},
      {"redis://h:1,redis://h:1/0", "listed twice"},
  };
  for (auto &[url, why] : bad) {
    c.g4_url = url;
    EXPECT_EQ(kvt::remote::parse_config(&rc, c, kLayout), KVT_ERR_INVALID_ARGUMENT) << url;
    std::string e = err();
    EXPECT_NE(e.find("g4_url"), std::string::npos) << url << ": " << e;
    EXPECT_NE(e.find(why), std::string::npos) << url << ": " << e;
  }
  c.g4_url = "redis://[::1]:6380";
  EXPECT_EQ(kvt::remote::parse_config(&rc, c, kLayout), KVT_OK) << err();
  c.g4_key_prefix = "";
  EXPECT_EQ(kvt::remote::parse_config(&rc, c, kLayout), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_NE(err().find("g4_key_prefix"), std::string::npos);
  c.g4_key_prefix = "my app";
  EXPECT_EQ(kvt::remote::parse_config(&rc, c, kLayout), KVT_ERR_INVALID_ARGUMENT);
  c.g4_key_prefix = "app";
  c.g4_timeout_us = 0;
  EXPECT_EQ(kvt::remote::parse_config(&rc, c, kLayout), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_NE(err().find("g4_timeout_us"), std::string::npos);
}

// An unreachable shard at create is no error (nothing connects until the first call), and
// calls fail with IO naming it.
TEST(G4Client, NothingListeningIsIo) {
  RedisServer redis;
  ASSERT_TRUE(redis.start());
  int port = redis.port();
  redis.kill9();
  auto store = make_store(config("redis://127.0.0.1:" + std::to_string(port)));
  Blocks b(1, 64, 15);
  std::vector<kvt_status> st(1);
  auto p = b.puts();
  store->put(p.data(), 1, st.data());
  EXPECT_EQ(st[0], KVT_ERR_IO);
  EXPECT_NE(err().find("cannot connect"), std::string::npos)
      << err();
}

// The value codec alone: a value it wrote decodes; every single-byte change of the header
// is caught.
TEST(G4Client, ValueCodecCatchesEveryHeaderByte) {
  std::vector<uint8_t> v(kvt::remote::kHeaderBytes + 100);
  for (size_t i = 0; i < 100; ++i) v[kvt::remote::kHeaderBytes + i] = uint8_t(i * 7);
  kvt::remote::ValueId id{1, 2, 3, 4};
  kvt::remote::encode_header(v.data(), id, v.data() + kvt::remote::kHeaderBytes, 100, nullptr);
  const uint8_t *p = nullptr;
  ASSERT_EQ(kvt::remote::decode_value(v.data(), v.size(), id, 100, &p, nullptr), KVT_OK);
  EXPECT_EQ(p, v.data() + kvt::remote::kHeaderBytes);
  for (size_t i = 0; i < kvt::remote::kHeaderBytes; ++i) {
    auto w = v;
    w[i] ^= 0x10;
    EXPECT_EQ(kvt::remote::decode_value(w.data(), w.size(), id, 100, &p, nullptr), KVT_ERR_CORRUPT)
        << i;
  }
}

// Several threads put and get their own blocks through one Store at once, over two shards.
TEST(Threads, G4ClientConcurrentPutGet) {
  RedisServer a, b;
  ASSERT_TRUE(a.start());
  ASSERT_TRUE(b.start());
  auto store = make_store(config(a.url() + "," + b.url()));
  constexpr int kThreads = 4, kRounds = 10;
  std::atomic<int> bad{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t)
    ts.emplace_back([&, t] {
      for (int r = 0; r < kRounds; ++r) {
        Blocks blk(8, 2048, uint64_t(t) * 1000 + r + 100);
        auto p = blk.puts();
        std::vector<kvt_status> st(p.size());
        store->put(p.data(), p.size(), st.data());
        for (kvt_status s : st) bad += s != KVT_OK;
        std::vector<std::vector<uint8_t>> got;
        for (kvt_status s : blk.get(*store, &got)) bad += s != KVT_OK;
        bad += got != blk.data;
        size_t n = 0;
        bad += store->exists_prefix(&n, blk.hashes.data(), 8) != KVT_OK || n != 8;
      }
    });
  for (auto &t : ts) t.join();
  EXPECT_EQ(bad.load(), 0);
  kvt_g4_stats s = stats_of(*store);
  EXPECT_EQ(s.stored_blocks, uint64_t(kThreads * kRounds * 8));
  EXPECT_EQ(s.loaded_blocks, uint64_t(kThreads * kRounds * 8));
  EXPECT_EQ(a.integer({"DBSIZE"}) + b.integer({"DBSIZE"}), kThreads * kRounds * 8);
}

}  // namespace

// Issue 27, values no other tenant can forge: with g4_key_env, a value is served only with
// the MAC of this namespace's key. Refused (a miss, counted, the key deleted): a value from
// a client without the key, from a tenant with another key, one copied from another
// block's key, and one replayed from a write under the key before a rotation.
TEST(G4Client, KeyedValuesNoOtherTenantCanForge) {
  RedisServer redis;
  ASSERT_TRUE(redis.start());
  const char *kA = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
  const char *kB = "ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100";
  const char *kOld = "0f0e0d0c0b0a09080706050403020100f0e0d0c0b0a090807060504030201000";
  auto a = make_store(keyed(redis.url(), "KVT_TEST_G4_KEY", kA));
  auto a2 = make_store(keyed(redis.url(), "KVT_TEST_G4_KEY", kA));
  // The same key: byte for byte, in both directions.
  Blocks own(4, 4096, 21);
  own.put(*a);
  std::vector<std::vector<uint8_t>> got;
  EXPECT_EQ(own.get(*a2, &got), std::vector<kvt_status>(4, KVT_OK));
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(got[i], own.data[i]) << i;
  auto v = redis.command({"GET", key_of(own.hashes[0])});
  ASSERT_TRUE(v && v->type == REDIS_REPLY_STRING);
  EXPECT_EQ(v->str[4], 2) << "keyed values are version 2";

  // A client without the key, writing values with correct checksums.
  Blocks plain(3, 4096, 22);
  auto unkeyed = make_store(config(redis.url()));
  plain.put(*unkeyed);
  EXPECT_EQ(plain.get(*a), std::vector<kvt_status>(3, KVT_ERR_CORRUPT));
  EXPECT_NE(err().find("written without a key"), std::string::npos) << err();
  // A tenant of the same namespace with another key.
  Blocks other(3, 4096, 23);
  auto b = make_store(keyed(redis.url(), "KVT_TEST_G4_KEY", kB));
  other.put(*b);
  EXPECT_EQ(other.get(*a), std::vector<kvt_status>(3, KVT_ERR_CORRUPT));
  EXPECT_NE(err().find("MAC"), std::string::npos) << err();
  // A valid value of this key under another block's key, and one with a byte flipped.
  Blocks moved(3, 4096, 24);
  moved.put(*a);
  auto m0 = redis.command({"GET", key_of(moved.hashes[0])});
  ASSERT_TRUE(redis.command({"SET", key_of(moved.hashes[1]), std::string(m0->str, m0->len)}));
  std::string flipped(m0->str, m0->len);
  flipped[200] ^= 1;
  ASSERT_TRUE(redis.command({"SET", key_of(moved.hashes[2]), flipped}));
  EXPECT_EQ(moved.get(*a),
            (std::vector<kvt_status>{KVT_OK, KVT_ERR_CORRUPT, KVT_ERR_CORRUPT}));
  // A value written under the key before a rotation, put back after it.
  Blocks rotated(2, 4096, 25);
  auto old_key = make_store(keyed(redis.url(), "KVT_TEST_G4_KEY", kOld));
  rotated.put(*old_key);
  std::vector<std::string> before;
  for (uint64_t h : rotated.hashes) {
    auto r = redis.command({"GET", key_of(h)});
    before.emplace_back(r->str, r->len);
  }
  rotated.put(*a);
  EXPECT_EQ(rotated.get(*a), std::vector<kvt_status>(2, KVT_OK));
  for (size_t i = 0; i < 2; ++i)
    ASSERT_TRUE(redis.command({"SET", key_of(rotated.hashes[i]), before[i]}));
  EXPECT_EQ(rotated.get(*a), std::vector<kvt_status>(2, KVT_ERR_CORRUPT));
  // Every refusal counted, its key deleted; what this key wrote still served.
  for (uint64_t h : rotated.hashes) EXPECT_EQ(redis.integer({"EXISTS", key_of(h)}), 0);
  EXPECT_EQ(stats_of(*a).corrupt_blocks, 3u + 3u + 2u + 2u);
  EXPECT_EQ(own.get(*a), std::vector<kvt_status>(4, KVT_OK));
  // An unkeyed reader refuses keyed values too: it cannot check them.
  EXPECT_EQ(own.get(*unkeyed), std::vector<kvt_status>(4, KVT_ERR_CORRUPT));
  EXPECT_NE(err().find("written with a key"), std::string::npos) << err();
}

TEST(G4Client, AKeyVariableThatIsUnsetOrNotAKeyIsRefusedWithoutShowingIt) {
  kvt_manager_config c;
  kvt_manager_config_init(&c);
  c.g4_url = "redis://127.0.0.1:1";
  c.g4_key_env = "KVT_TEST_G4_KEY";
  kvt::remote::Config rc;
  unsetenv("KVT_TEST_G4_KEY");
  EXPECT_EQ(kvt::remote::parse_config(&rc, c, kLayout), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_NE(err().find("KVT_TEST_G4_KEY"), std::string::npos) << err();
  const std::string hex = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
  for (const std::string &bad : {std::string(), hex.substr(0, 8), "zz" + hex.substr(2),
                                 hex + "00"}) {
    setenv("KVT_TEST_G4_KEY", bad.c_str(), 1);
    EXPECT_EQ(kvt::remote::parse_config(&rc, c, kLayout), KVT_ERR_INVALID_ARGUMENT) << bad;
    EXPECT_NE(err().find("64 hex digits"), std::string::npos) << err();
    if (!bad.empty()) {
      EXPECT_EQ(err().find(bad), std::string::npos) << "the key is never shown";
    }
  }
  unsetenv("KVT_TEST_G4_KEY");
  EXPECT_FALSE(rc.value_key.has_value());
}
