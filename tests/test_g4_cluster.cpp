// G4 on a real Redis Cluster (tests/redis_cluster.hpp: Debian's redis-server, joined by
// redis-cli): two processes share blocks through it byte for byte, a master is killed in
// the middle of a run and its replica takes over, and slots move between masters while
// blocks are written and read. Nothing wrong is ever served, the run goes on, and the
// counters say what was lost.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "redis_cluster.hpp"
#include "test_g4_support.hpp"

namespace {

using namespace kvt_g4_test;
using kvt_test::RedisCluster;

// One round of a run: a new chain offloaded from G2, then every stored chain onboarded into
// G1 and compared byte for byte. True when every transfer succeeded; a chain whose offload
// succeeded joins `stored`.
bool round_trip(kvt_manager *m, uint64_t base, std::vector<std::vector<uint64_t>> *stored) {
  bool ok = true;
  const std::vector<uint64_t> h = chain(base, 32);
  std::vector<kvt_block> src = filled_in(m, h, KVT_TIER_G2);
  const Ended e = offload(m, src, KVT_TIER_G4);
  release(m, src);
  EXPECT_TRUE(e.status == KVT_OK || e.status == KVT_ERR_IO) << kvt_status_str(e.status);
  if (e.status == KVT_OK && e.count == h.size()) stored->push_back(h);
  else ok = false;
  for (const std::vector<uint64_t> &s : *stored) {
    std::vector<kvt_block> got;
    const Ended o = g4_onboard(m, s, KVT_TIER_G1, &got);
    if (o.status == KVT_OK) EXPECT_EQ(mismatches(m, got, s), 0u) << "wrong bytes served";
    else ok = false;
    EXPECT_TRUE(o.status == KVT_OK || o.status == KVT_ERR_IO) << kvt_status_str(o.status);
    release(m, got);
  }
  return ok;
}

int first_master(RedisCluster &c, int other_than = -1) {
  for (size_t i = 0; i < c.size(); ++i)
    if (int(i) != other_than && c.node(i).running() && c.is_master(i)) return int(i);
  return -1;
}

TEST(G4Cluster, TwoProcessesShareBlocksByteForByte) {
  RedisCluster cluster;
  ASSERT_TRUE(cluster.start(3, 1));
  const std::string url = cluster.url();
  const auto h = chain(5, 30);  // the child's G1 holds 32
  ASSERT_TRUE(offloaded_by_another_process(url, h));

  // The keys are spread over every master, each in its hash's slot (the hash tag).
  long long total = 0;
  for (size_t i = 0; i < cluster.size(); ++i) {
    if (!cluster.is_master(i)) continue;
    const long long n = cluster.node(i).integer({"DBSIZE"});
    EXPECT_GT(n, 0) << "master " << i << " holds no key";
    total += n;
  }
  EXPECT_EQ(total, 30);

  TempDir dir;
  ManagerPtr m = make(g4_config(url, dir, 64, 16));
  ASSERT_TRUE(m);
  expect_served_whole(m.get(), h);
  const kvt_g4_stats s = g4_stats(m.get());
  EXPECT_EQ(s.shards, 3u);
  EXPECT_EQ(s.loaded_blocks, 30u);
  EXPECT_EQ(s.redirects, 0u);
  EXPECT_EQ(s.slot_map_reads, 1u);
  EXPECT_EQ(s.round_trips, 6u);  // EXISTS, GET: one pipeline per master each
  EXPECT_KVT(kvt_manager_check(m.get()), KVT_OK);
}

TEST(G4Cluster, AMasterKilledMidRunFailsOverAndTheRunGoesOn) {
  RedisCluster cluster;
  ASSERT_TRUE(cluster.start(3, 1));
  const std::string url = cluster.url();
  TempDir dir;
  kvt_manager_config c = g4_config(url, dir, 64, 1024);
  ManagerPtr m = make(c);
  ASSERT_TRUE(m);
  std::vector<std::vector<uint64_t>> stored;
  for (uint64_t base = 1; base <= 4; ++base) ASSERT_TRUE(round_trip(m.get(), base, &stored));

  const int victim = first_master(cluster);
  ASSERT_GE(victim, 0);
  int replica = -1;
  for (size_t i = 0; i < cluster.size(); ++i)
    if (!cluster.is_master(i) && cluster.master_of(i) == victim) replica = int(i);
  ASSERT_GE(replica, 0) << "no replica follows master " << victim;
  auto deadline = std::chrono::steady_clock::now() + 30s;
  while (!cluster.caught_up(size_t(replica)) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(10ms);
  ASSERT_TRUE(cluster.caught_up(size_t(replica)));
  const kvt_g4_stats before = g4_stats(m.get());
  EXPECT_EQ(before.failed_blocks, 0u);

  // The run goes on through the kill: rounds fail while the cluster has no master for the
  // victim's slots, then succeed again once its replica serves them.
  cluster.node(size_t(victim)).kill9();
  bool promoted = false;
  int good_after = 0;
  uint64_t base = 100;
  deadline = std::chrono::steady_clock::now() + 120s;
  while (good_after < 2 && std::chrono::steady_clock::now() < deadline) {
    const bool ok = round_trip(m.get(), base++, &stored);
    promoted = promoted || cluster.is_master(size_t(replica));
    if (promoted && ok) ++good_after;
  }
  ASSERT_TRUE(promoted) << "the replica never took over";
  ASSERT_EQ(good_after, 2) << "the run did not recover after the failover";
  const kvt_g4_stats s = g4_stats(m.get());
  EXPECT_GT(s.failed_blocks, 0u) << "no transfer ran while the master was down";
  EXPECT_GE(s.slot_map_reads, 2u);
  EXPECT_EQ(s.corrupt_blocks, 0u);
  EXPECT_EQ(s.shards, 3u);
  // Every chain stored before the kill was replicated: all of them are still served.
  for (size_t i = 0; i < 4; ++i) {
    std::vector<kvt_block> got;
    ASSERT_EQ(g4_onboard(m.get(), stored[i], KVT_TIER_G1, &got).status, KVT_OK)
        << kvt_last_error();
    EXPECT_EQ(mismatches(m.get(), got, stored[i]), 0u);
    release(m.get(), got);
  }
  EXPECT_KVT(kvt_manager_check(m.get()), KVT_OK);
}

TEST(G4Cluster, SlotsMovedMidRunAreFollowedAndNothingIsLost) {
  RedisCluster cluster;
  ASSERT_TRUE(cluster.start(3, 0));
  TempDir dir;
  const std::string url = cluster.url();
  ManagerPtr m = make(g4_config(url, dir, 64, 1024));
  ASSERT_TRUE(m);
  std::vector<std::vector<uint64_t>> stored;
  for (uint64_t base = 1; base <= 8; ++base) ASSERT_TRUE(round_trip(m.get(), base, &stored));

  const int from = first_master(cluster), to = first_master(cluster, from);
  ASSERT_GE(to, 0);
  const pid_t reshard = cluster.reshard_async(size_t(from), size_t(to), 4000);
  ASSERT_GT(reshard, 0);
  // Every round while the slots move, and one after, succeeds whole.
  int st = 0;
  uint64_t base = 100;
  const auto deadline = std::chrono::steady_clock::now() + 120s;
  bool done = false;
  for (;;) {
    EXPECT_TRUE(round_trip(m.get(), base++, &stored)) << kvt_last_error();
    if (done || std::chrono::steady_clock::now() > deadline) break;
    done = waitpid(reshard, &st, WNOHANG) == reshard;
  }
  if (!done) {
    kill(reshard, SIGKILL);
    waitpid(reshard, &st, 0);
  }
  ASSERT_TRUE(done) << "the reshard did not end";
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0)
      << RedisCluster::read_file(cluster.reshard_log());
  const kvt_g4_stats s = g4_stats(m.get());
  EXPECT_EQ(s.failed_blocks, 0u);
  EXPECT_EQ(s.missing_blocks, 0u);
  EXPECT_EQ(s.corrupt_blocks, 0u);
  EXPECT_GT(s.redirects, 0u) << "no command met a moved slot";
  EXPECT_GE(s.slot_map_reads, 2u);
  EXPECT_KVT(kvt_manager_check(m.get()), KVT_OK);
}

// Three threads offload and onboard through one manager while slots move: the route is read
// again, and nodes added, under their feet (TSan runs this one).
TEST(Threads, G4ClusterFromManyThreadsWhileSlotsMove) {
  RedisCluster cluster;
  ASSERT_TRUE(cluster.start(3, 0));
  TempDir dir;
  const std::string url = cluster.url();
  ManagerPtr m = make(g4_config(url, dir, 64, 1024));
  ASSERT_TRUE(m);
  const int from = first_master(cluster), to = first_master(cluster, from);
  ASSERT_GE(to, 0);
  const pid_t reshard = cluster.reshard_async(size_t(from), size_t(to), 2000);
  ASSERT_GT(reshard, 0);
  std::atomic<bool> done{false};
  std::vector<std::thread> threads;
  for (uint64_t t = 0; t < 3; ++t)
    threads.emplace_back([&, t] {
      for (uint64_t k = 0; k < 3 || !done.load(); ++k) {
        const std::vector<uint64_t> h = chain(1000 * (t + 1) + k, 16);
        std::vector<kvt_block> src = filled_in(m.get(), h, KVT_TIER_G2);
        EXPECT_EQ(offload(m.get(), src, KVT_TIER_G4).status, KVT_OK) << kvt_last_error();
        release(m.get(), src);
        std::vector<kvt_block> got;
        EXPECT_EQ(g4_onboard(m.get(), h, KVT_TIER_G1, &got).status, KVT_OK) << kvt_last_error();
        EXPECT_EQ(mismatches(m.get(), got, h), 0u);
        release(m.get(), got);
      }
    });
  int st = 0;
  const auto deadline = std::chrono::steady_clock::now() + 120s;
  while (waitpid(reshard, &st, WNOHANG) != reshard) {
    if (std::chrono::steady_clock::now() > deadline) {
      kill(reshard, SIGKILL);
      waitpid(reshard, &st, 0);
      break;
    }
    std::this_thread::sleep_for(10ms);
  }
  done = true;
  for (std::thread &t : threads) t.join();
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0)
      << RedisCluster::read_file(cluster.reshard_log());
  const kvt_g4_stats s = g4_stats(m.get());
  EXPECT_EQ(s.failed_blocks + s.missing_blocks + s.corrupt_blocks, 0u);
  EXPECT_KVT(kvt_manager_check(m.get()), KVT_OK);
}

TEST(G4Cluster, SeedsThatAreNotAClusterAreRefused) {
  TempDir dir;
  for (const char *bad : {"redis+cluster://127.0.0.1:7000/1", "redis+cluster://",
                          "redis+cluster://127.0.0.1:7000,unix:///tmp/r.sock",
                          "redis+cluster://127.0.0.1:7000,127.0.0.1:7000"}) {
    SCOPED_TRACE(bad);
    const std::string url = bad;  // g4_config borrows it
    kvt_manager_config c = g4_config(url, dir, 8, 8);
    kvt_manager *m = nullptr;
    EXPECT_KVT(kvt_manager_create(&m, &c), KVT_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(kvt_last_error()).find("g4_url"), std::string::npos)
        << kvt_last_error();
  }
  {  // Braces in the prefix would make every key's tag the prefix's: one slot for all.
    const std::string url = "redis+cluster://127.0.0.1:7000";
    kvt_manager_config c = g4_config(url, dir, 8, 8);
    c.g4_key_prefix = "kv{tenant}";
    kvt_manager *m = nullptr;
    EXPECT_KVT(kvt_manager_create(&m, &c), KVT_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(kvt_last_error()).find("hash tag"), std::string::npos)
        << kvt_last_error();
  }
  // A plain server given as a seed: every call fails with its words, none hangs.
  RedisServer plain;
  ASSERT_TRUE(plain.start());
  const std::string url = "redis+cluster://127.0.0.1:" + std::to_string(plain.port());
  ManagerPtr m = make(g4_config(url, dir, 8, 8));
  ASSERT_TRUE(m);
  size_t n = 99;
  const uint64_t h[2] = {1, 2};
  EXPECT_KVT(kvt_g4_match(&n, m.get(), h, 2), KVT_ERR_IO);
  EXPECT_EQ(n, 0u);
  EXPECT_NE(std::string(kvt_last_error()).find("cluster support disabled"), std::string::npos)
      << kvt_last_error();
}

}  // namespace
