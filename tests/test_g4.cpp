// G4 through the C ABI against a real redis-server (tests/redis_server.hpp): offload from
// G1, G2 and G3, onboard into G1 and G2 of another manager and of another process, Redis
// killed in the middle of a batch and restarted, Redis full, a value overwritten with
// garbage, cancellation, and bad inputs.
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "test_g4_support.hpp"

namespace {

using namespace kvt_g4_test;

TEST(G4, OffloadFromEveryTierThenOnboardIntoAnotherManager) {
  RedisServer redis;
  ASSERT_TRUE(redis.start());
  const std::string url = redis.url();
  TempDir dir_a, dir_b;
  ManagerPtr a = make(g4_config(url, dir_a, 32, 16, 16));
  ASSERT_TRUE(a);
  const auto x = chain(1, 8), y = chain(2, 8), z = chain(3, 4);

  // G2 -> G4 and G3 -> G4: the blocks first go down from G1.
  std::vector<kvt_block> g1 = filled_in(a.get(), x);
  ASSERT_EQ(offload(a.get(), g1, KVT_TIER_G2).status, KVT_OK);
  release(a.get(), g1);
  std::vector<kvt_block> in_g2;
  ASSERT_EQ(matched(a.get(), KVT_TIER_G2, x, &in_g2), 8u);
  Ended e = offload(a.get(), in_g2, KVT_TIER_G4);
  EXPECT_EQ(e.status, KVT_OK) << kvt_last_error();
  EXPECT_EQ(e.count, 8u);
  EXPECT_EQ(e.events, 1);
  EXPECT_EQ(e.event_tier, uint32_t(KVT_TIER_G4));
  release(a.get(), in_g2);

  g1 = filled_in(a.get(), y);
  ASSERT_EQ(offload(a.get(), g1, KVT_TIER_G3).status, KVT_OK);
  release(a.get(), g1);
  std::vector<kvt_block> in_g3;
  ASSERT_EQ(matched(a.get(), KVT_TIER_G3, y, &in_g3), 8u);
  e = offload(a.get(), in_g3, KVT_TIER_G4);
  EXPECT_EQ(e.status, KVT_OK) << kvt_last_error();
  EXPECT_EQ(e.count, 8u);
  release(a.get(), in_g3);

  g1 = filled_in(a.get(), z);  // G1 -> G4
  e = offload(a.get(), g1, KVT_TIER_G4);
  EXPECT_EQ(e.status, KVT_OK) << kvt_last_error();
  EXPECT_EQ(e.count, 4u);
  release(a.get(), g1);

  kvt_transfer_stats ts{};
  ts.struct_size = sizeof ts;
  ASSERT_KVT_OK(kvt_transfer_stats_get(&ts, a.get(), KVT_TIER_G2, KVT_TIER_G4));
  EXPECT_EQ(ts.completed, 1u);
  EXPECT_EQ(ts.blocks, 8u);
  ASSERT_KVT_OK(kvt_transfer_stats_get(&ts, a.get(), KVT_TIER_G3, KVT_TIER_G4));
  EXPECT_EQ(ts.blocks, 8u);
  EXPECT_EQ(g4_stats(a.get()).stored_blocks, 20u);
  EXPECT_EQ(redis.integer({"DBSIZE"}), 20);
  EXPECT_KVT(kvt_manager_check(a.get()), KVT_OK);

  // Another manager finds and onboards them, byte-exact, into G1 and into G2.
  ManagerPtr b = make(g4_config(url, dir_b, 32, 16));
  ASSERT_TRUE(b);
  EXPECT_EQ(g4_matched(b.get(), x), 8u);
  EXPECT_EQ(g4_matched(b.get(), y), 8u);
  std::vector<uint64_t> longer = z;
  longer.push_back(424242);
  EXPECT_EQ(g4_matched(b.get(), longer), 4u);

  std::vector<kvt_block> got;
  e = g4_onboard(b.get(), x, KVT_TIER_G1, &got);
  ASSERT_EQ(e.status, KVT_OK) << kvt_last_error();
  EXPECT_EQ(e.count, 8u);
  EXPECT_EQ(e.event_tier, uint32_t(KVT_TIER_G1));
  EXPECT_EQ(mismatches(b.get(), got, x), 0u);
  EXPECT_EQ(matched(b.get(), KVT_TIER_G1, x), 8u);
  // Again into G1: G1 holds them now, so the final handles are those blocks.
  std::vector<kvt_block> again;
  e = g4_onboard(b.get(), x, KVT_TIER_G1, &again);
  ASSERT_EQ(e.status, KVT_OK) << kvt_last_error();
  EXPECT_EQ(again, got);
  release(b.get(), again);
  release(b.get(), got);

  e = g4_onboard(b.get(), y, KVT_TIER_G2, &got);
  ASSERT_EQ(e.status, KVT_OK) << kvt_last_error();
  EXPECT_EQ(e.count, 8u);
  EXPECT_EQ(mismatches(b.get(), got, y), 0u);
  EXPECT_EQ(matched(b.get(), KVT_TIER_G2, y), 8u);
  release(b.get(), got);

  kvt_g4_stats s = g4_stats(b.get());
  EXPECT_EQ(s.loaded_blocks, 24u);
  EXPECT_EQ(s.shards, 1u);
  ASSERT_KVT_OK(kvt_transfer_stats_get(&ts, b.get(), KVT_TIER_G4, KVT_TIER_G2));
  EXPECT_EQ(ts.completed, 1u);
  EXPECT_EQ(ts.bytes, 8u * 4096);
  EXPECT_KVT(kvt_manager_check(b.get()), KVT_OK);
}

TEST(G4, TwoProcessesShareAPrefix) {
  RedisServer redis;
  ASSERT_TRUE(redis.start());
  const std::string url = redis.url();
  const auto h = chain(5, 12);
  ASSERT_TRUE(offloaded_by_another_process(url, h));

  TempDir dir;
  ManagerPtr m = make(g4_config(url, dir, 32, 16));
  ASSERT_TRUE(m);
  expect_served_whole(m.get(), h);
  EXPECT_KVT(kvt_manager_check(m.get()), KVT_OK);
}

TEST(G4, RedisKilledDuringABatchThenRestarted) {
  RedisServer redis;
  ASSERT_TRUE(redis.start());
  const std::string url = redis.url();
  TempDir dir;
  kvt_manager_config c = g4_config(url, dir, 16, 640);
  c.max_batch_size = 64;
  c.g4_timeout_us = 500000;  // the kill comes well before a paused write times out
  ManagerPtr m = make(c);
  ASSERT_TRUE(m);
  const auto big = chain(7, 512);
  std::vector<kvt_block> src = filled_in(m.get(), big, KVT_TIER_G2);
  ASSERT_EQ(g4_matched(m.get(), {big[0]}), 0u);  // connected

  // Redis holds the batch's writes unanswered until it dies: the kill lands mid-batch.
  auto paused = redis.command({"CLIENT", "PAUSE", "10000", "WRITE"});
  ASSERT_TRUE(paused && paused->type == REDIS_REPLY_STATUS);
  kvt_xfer *x = nullptr;
  ASSERT_KVT_OK(kvt_xfer_offload(&x, m.get(), src.data(), src.size(), KVT_TIER_G4, nullptr, 0));
  auto deadline = std::chrono::steady_clock::now() + 10s;
  while (state_of_xfer(x) != KVT_XFER_INFLIGHT && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(1ms);
  ASSERT_EQ(state_of_xfer(x), uint32_t(KVT_XFER_INFLIGHT));
  std::this_thread::sleep_for(100ms);  // its first batch is in Redis's hands
  redis.kill9();
  Ended e = wait_end(m.get(), x);
  EXPECT_EQ(e.status, KVT_ERR_IO) << kvt_last_error();
  EXPECT_EQ(e.events, 1);
  EXPECT_LT(e.count, big.size());
  kvt_xfer_release(x);
  EXPECT_GT(g4_stats(m.get()).failed_blocks, 0u);

  // G4 is down; G1-G3 keep serving.
  size_t n = 99;
  EXPECT_KVT(kvt_g4_match(&n, m.get(), big.data(), 4), KVT_ERR_IO);
  EXPECT_EQ(n, 0u);
  EXPECT_STRNE(kvt_last_error(), "no error");
  const std::vector<uint64_t> head(big.begin(), big.begin() + 8);
  std::vector<kvt_block> in_g2;
  ASSERT_EQ(matched(m.get(), KVT_TIER_G2, head, &in_g2), 8u);
  std::vector<kvt_block> g1 = alloc(m.get(), 8);
  ASSERT_KVT_OK(kvt_xfer_onboard(&x, m.get(), in_g2.data(), g1.data(), 8, nullptr, 0));
  Ended on = wait_end(m.get(), x);
  EXPECT_EQ(on.status, KVT_OK) << kvt_last_error();
  EXPECT_EQ(mismatches(m.get(), g1, head), 0u);
  kvt_xfer_release(x);
  release(m.get(), g1);
  release(m.get(), in_g2);
  EXPECT_KVT(kvt_manager_check(m.get()), KVT_OK);

  // Redis is back (empty): the next offload reconnects and writes.
  ASSERT_TRUE(redis.restart());
  const uint64_t reconnects = g4_stats(m.get()).reconnects;
  std::vector<kvt_block> some(src.begin(), src.begin() + 16);
  e = offload(m.get(), some, KVT_TIER_G4);
  EXPECT_EQ(e.status, KVT_OK) << kvt_last_error();
  EXPECT_EQ(e.count, 16u);
  EXPECT_EQ(g4_matched(m.get(), big), 16u);
  EXPECT_GE(g4_stats(m.get()).reconnects, reconnects);
  EXPECT_GE(g4_stats(m.get()).reconnects, 1u);
  release(m.get(), src);
  EXPECT_KVT(kvt_manager_check(m.get()), KVT_OK);
}

TEST(G4, FullRedisEvictsOldValuesAndTheirOnboardIsNotFound) {
  RedisServer redis;
  kvt_test::RedisOptions full;
  full.maxmemory = "8mb";
  full.policy = "allkeys-lru";
  ASSERT_TRUE(redis.start(full));
  const std::string url = redis.url();
  TempDir dir;
  kvt_manager_config c = g4_config(url, dir, 160, 160);
  c.chunk_bytes = 8192;  // 32 KiB blocks: four chains of 4 MiB overflow 8 MiB
  ManagerPtr m = make(c);
  ASSERT_TRUE(m);
  const auto first = chain(11, 128);
  for (uint64_t base : {11, 12, 13, 14}) {
    const auto h = chain(base, 128);
    std::vector<kvt_block> b = filled_in(m.get(), h, KVT_TIER_G2);
    Ended e = offload(m.get(), b, KVT_TIER_G4);
    EXPECT_EQ(e.status, KVT_OK) << kvt_last_error();
    EXPECT_EQ(e.count, 128u);  // Redis makes room for every write
    release(m.get(), b);  // inactive: the next chain's allocation evicts them
  }
  const size_t held = g4_matched(m.get(), first);
  EXPECT_LT(held, first.size()) << "Redis evicted nothing of the oldest chain";
  const long long keys = redis.integer({"DBSIZE"});
  EXPECT_GT(keys, 0);
  EXPECT_LT(keys, 4 * 128);

  std::vector<kvt_block> dst;
  Ended e = g4_onboard(m.get(), first, KVT_TIER_G1, &dst);
  EXPECT_EQ(e.status, KVT_ERR_NOT_FOUND) << kvt_last_error();
  EXPECT_LE(e.count, held);
  // The prefix before the first miss is registered in place; the rest stays Empty.
  EXPECT_EQ(matched(m.get(), KVT_TIER_G1, first), e.count);
  for (size_t i = 0; i < dst.size(); ++i)
    EXPECT_EQ(state_of(m.get(), dst[i]),
              uint32_t(i < e.count ? KVT_BLOCK_REGISTERED : KVT_BLOCK_EMPTY))
        << i;
  const std::vector<uint64_t> prefix(first.begin(), first.begin() + e.count);
  EXPECT_EQ(mismatches(m.get(), {dst.begin(), dst.begin() + e.count}, prefix), 0u);
  EXPECT_GE(g4_stats(m.get()).missing_blocks, 1u);
  release(m.get(), dst);
  EXPECT_KVT(kvt_manager_check(m.get()), KVT_OK);
}

TEST(G4, GarbageValueIsCorruptDeletedAndThePrefixBeforeItRegistered) {
  RedisServer redis;
  ASSERT_TRUE(redis.start());
  const std::string url = redis.url();
  TempDir dir_a, dir_b;
  ManagerPtr a = make(g4_config(url, dir_a, 16, 16));
  ASSERT_TRUE(a);
  const auto h = chain(21, 8);
  std::vector<kvt_block> g1 = filled_in(a.get(), h);
  // Block 3 alone first, to learn its key without knowing the key format.
  ASSERT_EQ(offload(a.get(), {g1[3]}, KVT_TIER_G4).status, KVT_OK) << kvt_last_error();
  auto keys = redis.command({"KEYS", "*"});
  ASSERT_TRUE(keys && keys->type == REDIS_REPLY_ARRAY && keys->elements == 1);
  const std::string key(keys->element[0]->str, keys->element[0]->len);
  ASSERT_EQ(offload(a.get(), g1, KVT_TIER_G4).count, 8u);
  release(a.get(), g1);
  ASSERT_TRUE(redis.command({"SET", key, std::string(4096 + 64, 'x')}));

  ManagerPtr b = make(g4_config(url, dir_b, 16, 16));
  ASSERT_TRUE(b);
  for (kvt_tier t : {KVT_TIER_G2, KVT_TIER_G1}) {  // the second time the key is gone
    std::vector<kvt_block> dst;
    Ended e = g4_onboard(b.get(), h, t, &dst);
    EXPECT_EQ(e.status, t == KVT_TIER_G2 ? KVT_ERR_CORRUPT : KVT_ERR_NOT_FOUND)
        << kvt_last_error();
    EXPECT_EQ(e.events, 1);
    EXPECT_EQ(e.count, 3u);
    for (size_t i = 0; i < dst.size(); ++i)
      EXPECT_EQ(state_of(b.get(), dst[i]),
                uint32_t(i < 3 ? KVT_BLOCK_REGISTERED : KVT_BLOCK_EMPTY))
          << i;
    EXPECT_EQ(mismatches(b.get(), {dst.begin(), dst.begin() + 3}, {h.begin(), h.begin() + 3}),
              0u);
    EXPECT_EQ(matched(b.get(), t, h), 3u);
    release(b.get(), dst);
    EXPECT_EQ(redis.integer({"EXISTS", key}), 0) << "a corrupt value is deleted";
  }
  EXPECT_EQ(g4_stats(b.get()).corrupt_blocks, 1u);
  EXPECT_EQ(g4_matched(b.get(), h), 3u);
  EXPECT_KVT(kvt_manager_check(b.get()), KVT_OK);
}

// g4_key_env through the C ABI: managers with the namespace's key share G4 byte for byte;
// one with another key finds nothing it can take: its onboard is refused (counted, the
// values deleted), never served.
TEST(G4, OnlyManagersWithTheNamespacesKeyShareItsValues) {
  RedisServer redis;
  ASSERT_TRUE(redis.start());
  const std::string url = redis.url();
  setenv("KVT_TEST_G4_KEY_A",
         "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff", 1);
  setenv("KVT_TEST_G4_KEY_B",
         "ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100", 1);
  TempDir dir_w, dir_r, dir_x;
  auto keyed = [&](const TempDir &dir, const char *env) {
    kvt_manager_config c = g4_config(url, dir, 16, 16);
    c.g4_key_env = env;
    return make(c);
  };
  ManagerPtr writer = keyed(dir_w, "KVT_TEST_G4_KEY_A");
  ManagerPtr reader = keyed(dir_r, "KVT_TEST_G4_KEY_A");
  ManagerPtr stranger = keyed(dir_x, "KVT_TEST_G4_KEY_B");
  unsetenv("KVT_TEST_G4_KEY_A");
  unsetenv("KVT_TEST_G4_KEY_B");  // read at create only
  ASSERT_TRUE(writer && reader && stranger);
  const auto h = chain(31, 6);
  std::vector<kvt_block> g1 = filled_in(writer.get(), h);
  ASSERT_EQ(offload(writer.get(), g1, KVT_TIER_G4).count, 6u) << kvt_last_error();
  release(writer.get(), g1);

  std::vector<kvt_block> dst;
  Ended e = g4_onboard(reader.get(), h, KVT_TIER_G2, &dst);
  ASSERT_EQ(e.status, KVT_OK) << kvt_last_error();
  EXPECT_EQ(mismatches(reader.get(), dst, h), 0u);
  release(reader.get(), dst);

  e = g4_onboard(stranger.get(), h, KVT_TIER_G2, &dst);
  EXPECT_EQ(e.status, KVT_ERR_CORRUPT) << kvt_last_error();
  EXPECT_EQ(e.count, 0u);
  EXPECT_EQ(matched(stranger.get(), KVT_TIER_G2, h), 0u);
  release(stranger.get(), dst);
  EXPECT_EQ(g4_stats(stranger.get()).corrupt_blocks, 6u);
  EXPECT_EQ(g4_stats(reader.get()).corrupt_blocks, 0u);
  EXPECT_KVT(kvt_manager_check(stranger.get()), KVT_OK);
  // What fails its check is deleted, as any corrupt value (a forgery must not keep the
  // block from being stored again): a namespace's managers share its key.
  EXPECT_EQ(g4_matched(reader.get(), h), 0u);
}

TEST(G4, CancelBeforeCommitWritesAndRegistersNothing) {
  RedisServer redis;
  ASSERT_TRUE(redis.start());
  const std::string url = redis.url();
  TempDir dir;
  ManagerPtr m = make(g4_config(url, dir, 16, 16));
  ASSERT_TRUE(m);
  const auto h = chain(31, 4);
  std::vector<kvt_block> g1 = filled_in(m.get(), h);
  ASSERT_EQ(offload(m.get(), {g1[0], g1[1]}, KVT_TIER_G4).count, 2u);

  kvt_fence *f = nullptr;
  ASSERT_KVT_OK(kvt_fence_create(&f, m.get()));
  kvt_xfer *x = nullptr;
  ASSERT_KVT_OK(kvt_xfer_offload(&x, m.get(), g1.data() + 2, 2, KVT_TIER_G4, f, 0));
  ASSERT_KVT_OK(kvt_xfer_cancel(x));
  Ended e = wait_end(m.get(), x);
  EXPECT_EQ(e.status, KVT_ERR_CANCELLED);
  EXPECT_EQ(e.events, 1);
  kvt_xfer_release(x);

  std::vector<kvt_block> g2 = alloc(m.get(), 2, KVT_TIER_G2);
  ASSERT_KVT_OK(kvt_g4_onboard(&x, m.get(), h.data(), 2, 0, g2.data(), f, 0));
  ASSERT_KVT_OK(kvt_xfer_cancel(x));
  e = wait_end(m.get(), x);
  EXPECT_EQ(e.status, KVT_ERR_CANCELLED);
  EXPECT_EQ(e.events, 1);
  kvt_xfer_release(x);
  ASSERT_KVT_OK(kvt_fence_signal(f));
  kvt_fence_destroy(f);
  std::this_thread::sleep_for(20ms);
  EXPECT_EQ(redis.integer({"DBSIZE"}), 2);
  for (kvt_block b : g2) EXPECT_EQ(state_of(m.get(), b), uint32_t(KVT_BLOCK_EMPTY));
  EXPECT_EQ(matched(m.get(), KVT_TIER_G2, h), 0u);
  release(m.get(), g2);
  release(m.get(), g1);
  EXPECT_KVT(kvt_manager_check(m.get()), KVT_OK);
}

TEST(G4, BadInputsGetStatusesAndMessages) {
  RedisServer redis;
  ASSERT_TRUE(redis.start());
  const std::string url = redis.url();
  TempDir dir;
  const auto h = chain(41, 2);
  auto says = [](const char *what) {
    return std::string(kvt_last_error()).find(what) != std::string::npos;
  };

  // Without G4.
  ManagerPtr plain = make(xfer_config(dir, 8, 8, 0));
  ASSERT_TRUE(plain);
  std::vector<kvt_block> g1 = filled_in(plain.get(), h);
  kvt_xfer *x = nullptr;
  size_t n = 0;
  EXPECT_KVT(kvt_xfer_offload(&x, plain.get(), g1.data(), 2, KVT_TIER_G4, nullptr, 0),
             KVT_ERR_UNSUPPORTED);
  EXPECT_TRUE(says("g4_url")) << kvt_last_error();
  EXPECT_KVT(kvt_g4_match(&n, plain.get(), h.data(), 2), KVT_ERR_UNSUPPORTED);
  std::vector<kvt_block> dst = alloc(plain.get(), 2);
  EXPECT_KVT(kvt_g4_onboard(&x, plain.get(), h.data(), 2, 0, dst.data(), nullptr, 0),
             KVT_ERR_UNSUPPORTED);
  kvt_g4_stats gs{};
  gs.struct_size = sizeof gs;
  EXPECT_KVT(kvt_g4_stats_get(&gs, plain.get()), KVT_ERR_UNSUPPORTED);
  release(plain.get(), dst);
  release(plain.get(), g1);
  EXPECT_KVT(kvt_manager_check(plain.get()), KVT_OK);

  // Config.
  kvt_manager_config c = g4_config(url, dir, 8, 8);
  kvt_manager *bad = nullptr;
  c.g4_timeout_us = 0;
  EXPECT_KVT(kvt_manager_create(&bad, &c), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(says("g4_timeout_us")) << kvt_last_error();
  c = g4_config(url, dir, 8, 8);
  c.g4_url = "http://nowhere";
  EXPECT_KVT(kvt_manager_create(&bad, &c), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(says("g4_url")) << kvt_last_error();
  c = g4_config(url, dir, 8, 8);
  c.chunk_bytes = 0;
  EXPECT_KVT(kvt_manager_create(&bad, &c), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(says("chunk_bytes")) << kvt_last_error();
  EXPECT_EQ(bad, nullptr);
  kvt_manager_config d;
  kvt_manager_config_init(&d);
  EXPECT_EQ(d.g4_timeout_us, 1000000u);
  EXPECT_EQ(d.g4_url, nullptr);

  // With G4.
  ManagerPtr m = make(g4_config(url, dir, 8, 8, 8));
  ASSERT_TRUE(m);
  g1 = filled_in(m.get(), h);
  for (kvt_tier t : {KVT_TIER_G4}) {
    kvt_block b = 0;
    EXPECT_KVT(kvt_block_alloc(&b, 1, m.get(), t), KVT_ERR_INVALID_ARGUMENT);
    EXPECT_TRUE(says("G4")) << kvt_last_error();
    kvt_block out[2];
    EXPECT_KVT(kvt_tier_match_prefix(&n, out, m.get(), t, h.data(), 2), KVT_ERR_INVALID_ARGUMENT);
    EXPECT_TRUE(says("G4")) << kvt_last_error();
    EXPECT_KVT(kvt_tier_evictable_blocks(out, 2, &n, m.get(), t), KVT_ERR_INVALID_ARGUMENT);
    kvt_tier_stats ts{};
    ts.struct_size = sizeof ts;
    EXPECT_KVT(kvt_tier_stats_get(&ts, m.get(), t), KVT_ERR_INVALID_ARGUMENT);
    EXPECT_TRUE(says("G4")) << kvt_last_error();
    EXPECT_KVT(kvt_manager_reset(m.get(), int(t)), KVT_ERR_INVALID_ARGUMENT);
    EXPECT_TRUE(says("G4")) << kvt_last_error();
  }
  kvt_transfer_stats xs{};
  xs.struct_size = sizeof xs;
  EXPECT_KVT(kvt_transfer_stats_get(&xs, m.get(), KVT_TIER_G4, KVT_TIER_G3),
             KVT_ERR_INVALID_ARGUMENT);
  EXPECT_KVT(kvt_transfer_stats_get(&xs, m.get(), KVT_TIER_G1, KVT_TIER_G4), KVT_OK);

  // Arrays and counts.
  EXPECT_KVT(kvt_g4_match(nullptr, m.get(), h.data(), 2), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_KVT(kvt_g4_match(&n, m.get(), nullptr, 2), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(says("seq_hashes")) << kvt_last_error();
  n = 7;
  EXPECT_KVT(kvt_g4_match(&n, m.get(), nullptr, 0), KVT_OK);
  EXPECT_EQ(n, 0u);
  EXPECT_KVT(kvt_g4_match(&n, nullptr, h.data(), 2), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_KVT(kvt_xfer_offload(&x, m.get(), nullptr, 2, KVT_TIER_G4, nullptr, 0),
             KVT_ERR_INVALID_ARGUMENT);
  dst = alloc(m.get(), 2, KVT_TIER_G2);
  std::vector<kvt_block> g1dst = alloc(m.get(), 1);
  EXPECT_KVT(kvt_g4_onboard(&x, m.get(), nullptr, 2, 0, dst.data(), nullptr, 0),
             KVT_ERR_INVALID_ARGUMENT);
  EXPECT_KVT(kvt_g4_onboard(&x, m.get(), h.data(), 2, 0, nullptr, nullptr, 0),
             KVT_ERR_INVALID_ARGUMENT);
  EXPECT_KVT(kvt_g4_onboard(nullptr, m.get(), h.data(), 2, 0, dst.data(), nullptr, 0),
             KVT_ERR_INVALID_ARGUMENT);
  const kvt_block mixed[2] = {dst[0], g1dst[0]};
  EXPECT_KVT(kvt_g4_onboard(&x, m.get(), h.data(), 2, 0, mixed, nullptr, 0),
             KVT_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(says("one tier")) << kvt_last_error();
  const kvt_block twice[2] = {dst[0], dst[0]};
  EXPECT_KVT(kvt_g4_onboard(&x, m.get(), h.data(), 2, 0, twice, nullptr, 0),
             KVT_ERR_INVALID_ARGUMENT);
  EXPECT_KVT(kvt_g4_onboard(&x, m.get(), h.data(), 2, 0, g1.data(), nullptr, 0),
             KVT_ERR_STATE);  // registered, not Empty
  std::vector<kvt_block> g3 = alloc(m.get(), 2, KVT_TIER_G3);
  EXPECT_KVT(kvt_g4_onboard(&x, m.get(), h.data(), 2, 0, g3.data(), nullptr, 0),
             KVT_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(says("G1 or G2")) << kvt_last_error();
  const kvt_block forged[2] = {0, 12345};
  EXPECT_KVT(kvt_g4_onboard(&x, m.get(), h.data(), 2, 0, forged, nullptr, 0),
             KVT_ERR_INVALID_HANDLE);
  // n = 0: a transfer that ends at once, with nothing moved.
  ASSERT_KVT_OK(kvt_g4_onboard(&x, m.get(), nullptr, 0, 0, nullptr, nullptr, 0));
  Ended e = wait_end(m.get(), x);
  EXPECT_EQ(e.status, KVT_OK);
  EXPECT_EQ(e.count, 0u);
  EXPECT_EQ(e.events, 1);
  kvt_xfer_release(x);
  ASSERT_KVT_OK(kvt_xfer_offload(&x, m.get(), nullptr, 0, KVT_TIER_G4, nullptr, 0));
  EXPECT_EQ(wait_end(m.get(), x).status, KVT_OK);
  kvt_xfer_release(x);

  // Stats sizes: 0.4.0's size and none other below it.
  gs.struct_size = 8;
  EXPECT_KVT(kvt_g4_stats_get(&gs, m.get()), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_KVT(kvt_g4_stats_get(nullptr, m.get()), KVT_ERR_INVALID_ARGUMENT);
  gs.struct_size = sizeof gs;
  EXPECT_KVT(kvt_g4_stats_get(&gs, m.get()), KVT_OK);
  EXPECT_EQ(gs.struct_size, sizeof gs);
  EXPECT_EQ(sizeof(kvt_g4_stats), 112u);  // 0.5.0 added redirects and slot_map_reads
  gs.struct_size = 96;                    // a 0.4.0 caller: nothing written past its size
  gs.redirects = gs.slot_map_reads = 77;
  EXPECT_KVT(kvt_g4_stats_get(&gs, m.get()), KVT_OK);
  EXPECT_EQ(gs.redirects, 77u);
  EXPECT_EQ(gs.slot_map_reads, 77u);

  for (auto *v : {&dst, &g1dst, &g3, &g1}) release(m.get(), *v);
  EXPECT_EQ(redis.integer({"DBSIZE"}), 0);
  EXPECT_KVT(kvt_manager_check(m.get()), KVT_OK);
}

// Several threads offload their chains to G4 from one manager and onboard them into
// another, both managers shared by every thread.
TEST(Threads, G4OffloadAndOnboardFromManyThreads) {
  RedisServer redis;
  ASSERT_TRUE(redis.start());
  const std::string url = redis.url();
  TempDir dir_a, dir_b;
  kvt_manager_config c = g4_config(url, dir_a, 128, 16);
  c.max_concurrent_transfers = 2;
  ManagerPtr a = make(c);
  c = g4_config(url, dir_b, 16, 128);
  c.max_concurrent_transfers = 2;
  ManagerPtr b = make(c);
  ASSERT_TRUE(a && b);
  constexpr int kThreads = 4, kRounds = 3;
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      for (int r = 0; r < kRounds; ++r) {
        const auto h = chain(100 + t * kRounds + r, 8);
        std::vector<kvt_block> g1 = filled_in(a.get(), h);
        if (offload(a.get(), g1, KVT_TIER_G4).count != 8) ++bad;
        release(a.get(), g1);
        std::vector<kvt_block> got;
        if (g4_onboard(b.get(), h, KVT_TIER_G2, &got).status != KVT_OK) {
          ++bad;
          release(b.get(), got);
          continue;
        }
        if (mismatches(b.get(), got, h) != 0) ++bad;
        release(b.get(), got);
      }
    });
  for (auto &t : threads) t.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(redis.integer({"DBSIZE"}), kThreads * kRounds * 8);
  EXPECT_KVT(kvt_manager_check(a.get()), KVT_OK);
  EXPECT_KVT(kvt_manager_check(b.get()), KVT_OK);
}

}  // namespace
