// One scheduler half and two worker halves (tensor or pipeline parallelism), each worker
// with its own manager and its own shard of every block: a batch ends when both ranks'
// reports named it, a block is stored only when both shards are, each rank loads its own
// shard back, and a load that fails on one rank fails the block for all.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "connector/metadata.hpp"
#include "connector_support.hpp"

using namespace kvt_conn_test;

namespace {

kvt_connector_config parallel_config(uint32_t role, uint32_t rank, uint32_t store_tier) {
  kvt_connector_config c = connector_config(role, KVT_OFFLOAD_EAGER, store_tier);
  c.world_size = 2;
  c.rank = rank;
  return c;
}

// The bytes rank r computes for the block of hash h: each rank's shard differs.
uint64_t shard(uint64_t h, uint32_t rank) { return rank == 0 ? h : ~h; }

// The scheduler and its two workers, as vLLM runs them with TP 2 (or PP 2): only bytes
// pass between them.
struct World {
  explicit World(uint32_t store_tier = KVT_TIER_G2,
                 const kvt_manager_config &sm = seed_manager_config(),
                 const kvt_manager_config &w0m = seed_manager_config(),
                 const kvt_manager_config &w1m = seed_manager_config())
      : sched(parallel_config(KVT_ROLE_SCHEDULER, 0, store_tier), sm),
        w0(parallel_config(KVT_ROLE_WORKER, 0, store_tier), w0m),
        w1(parallel_config(KVT_ROLE_WORKER, 1, store_tier), w1m) {}
  Rig sched, w0, w1;
  Rig &worker(uint32_t r) { return r == 0 ? w0 : w1; }

  // Every rank runs the step's metadata, computing its own shard of fwd's blocks, up to
  // clear_connector_metadata; their copies go on.
  void step(const std::string &meta, const Forward &fwd,
            const std::function<void(uint32_t)> &after_load = {}) {
    for (uint32_t r = 0; r < 2; ++r) {
      Forward mine;
      for (auto [b, h] : fwd) mine.push_back({b, shard(h, r)});
      ASSERT_KVT_OK(worker_step(worker(r).c, worker(r).g1, meta, mine,
                                after_load ? [&] { after_load(r); } : std::function<void()>{}));
      ASSERT_KVT_OK(kvt_connector_clear_connector_metadata(worker(r).c));
    }
  }
  // Seed 003's request A on every rank: matched 0, G1 blocks {1, 2, 3}, one step that
  // computes its 40 tokens (blocks 1 and 2 full); their stores go on.
  void compute_a() {
    const auto a = seed_a();
    const auto ha = hashes_of(a);
    EXPECT_EQ(sched.match("A", a).first, 0u);
    ASSERT_KVT_OK(sched.alloc("A", {1, 2, 3}, 0));
    step(sched.meta({{"A", 0, 40}}), {{1, ha[0]}, {2, ha[1]}});
  }
  // Rank r's reports go to the scheduler until one names a store batch (or a load batch).
  void report_until(uint32_t r, bool loads, Finished *acc) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    for (;;) {
      std::string rep;
      ASSERT_KVT_OK(collect(worker(r).c, acc, &rep));
      ASSERT_KVT_OK(kvt_connector_update_connector_output(sched.c, rep.data(), rep.size()));
      kvt::conn::Report decoded;
      ASSERT_KVT_OK(kvt::conn::decode(&decoded, rep.data(), rep.size()));
      EXPECT_EQ(decoded.rank, r);
      EXPECT_EQ(decoded.shape.world_size, 2u);
      if (!(loads ? decoded.loads : decoded.stores).empty()) return;
      ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "rank " << r << " reported nothing";
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  // Both ranks' reports go to the scheduler, in turns, until done() holds.
  bool drain_both(Finished *f0, Finished *f1, const std::function<bool()> &done) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    for (;;) {
      for (uint32_t r = 0; r < 2; ++r) {
        std::string rep;
        EXPECT_KVT(collect(worker(r).c, r == 0 ? f0 : f1, &rep), KVT_OK);
        EXPECT_KVT(kvt_connector_update_connector_output(sched.c, rep.data(), rep.size()),
                   KVT_OK);
        if (done()) return true;
      }
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
};

}  // namespace

TEST(ConnectorParallel, ABlockIsStoredOnceEveryShardIsAndEachRankLoadsItsOwn) {
  World w;
  const auto b = seed_b();
  const auto ha = hashes_of(seed_a()), hb = hashes_of(b);

  // A computes blocks 1 and 2 on both ranks; rank 0's stores end first.
  w.compute_a();
  Finished f0, f1;
  w.report_until(0, false, &f0);
  EXPECT_EQ(w.sched.stats().stored_blocks, 0u) << "one shard of two is no block";
  EXPECT_EQ(w.sched.held(ha), 0u);
  EXPECT_EQ(w.w0.held(ha), 0u) << "a worker's manager registers nothing";
  EXPECT_EQ(w.sched.finish("A"), 1) << "rank 1's stores still read A's blocks";
  EXPECT_EQ(slot_state(w.sched.c, "A"), uint32_t(KVT_SLOT_FINISHING));
  w.report_until(1, false, &f1);
  EXPECT_EQ(w.sched.stats().stored_blocks, 2u);
  EXPECT_EQ(w.sched.held(ha), 2u);
  EXPECT_EQ(slot_state(w.sched.c, "A"), uint32_t(KVT_SLOT_FINISHED));

  // The next step's metadata announces A; each rank lists it in finished_sending once
  // (vLLM's KVOutputAggregator counts the two).
  w.step(w.sched.meta({}), {});
  ASSERT_TRUE(w.drain_both(&f0, &f1, [&] { return f0.sent("A") && f1.sent("A"); }));
  EXPECT_EQ(std::count(f0.sending.begin(), f0.sending.end(), "A"), 1);
  EXPECT_EQ(std::count(f1.sending.begin(), f1.sending.end(), "A"), 1);

  // B loads A's two blocks: each rank gets its own shard back, from its own manager.
  EXPECT_EQ(w.sched.match("B", b).first, 32u);
  ASSERT_KVT_OK(w.sched.alloc("B", {4, 5, 6, 7}, 32));
  bool loaded[2] = {false, false};
  w.step(w.sched.meta({{"B", 32, 20}}), {{6, hb[2]}}, [&](uint32_t r) {
    EngineG1 &g1 = w.worker(r).g1;
    loaded[r] = g1.holds(4, shard(ha[0], r)) && g1.holds(5, shard(ha[1], r));
  });
  EXPECT_TRUE(loaded[0]) << "rank 0's blocks 4 and 5 do not hold its shard of A";
  EXPECT_TRUE(loaded[1]) << "rank 1's blocks 4 and 5 do not hold its shard of A";
  w.report_until(0, true, &f0);
  EXPECT_EQ(w.sched.stats().loaded_blocks, 0u) << "counted at the last rank's report";
  ASSERT_TRUE(w.drain_both(&f0, &f1, w.sched.counts(3, 2)));
  EXPECT_EQ(w.sched.finish("B"), 0);
  const kvt_connector_stats s = w.sched.stats();
  EXPECT_EQ(s.stored_blocks, 3u);
  EXPECT_EQ(s.loaded_blocks, 2u);
  EXPECT_EQ(s.load_errors + s.store_failures, 0u);
  // Each worker's G2 holds its own shard of B's three blocks (by slot: workers register
  // nothing); the scheduler's registry names them once.
  EXPECT_EQ(w.sched.held(hb), 3u);
  EXPECT_TRUE(f0.load_errors.empty() && f1.load_errors.empty());
}

// A report of a rank outside the world, or a second report of one rank for a batch, is
// refused and changes nothing; a connector of both halves has a world of one.
TEST(ConnectorParallel, ReportsAreCountedOncePerRank) {
  World w;
  const auto a = seed_a();
  const auto ha = hashes_of(a);
  EXPECT_EQ(w.sched.match("A", a).first, 0u);
  ASSERT_KVT_OK(w.sched.alloc("A", {1, 2, 3}, 0));
  const std::string meta = w.sched.meta({{"A", 0, 40}});
  w.step(meta, {{1, ha[0]}, {2, ha[1]}});
  Finished f0;
  w.report_until(0, false, &f0);
  kvt::conn::Report again;
  ASSERT_KVT_OK(kvt::conn::decode(&again, f0.reports.back().data(), f0.reports.back().size()));
  ASSERT_EQ(again.stores.size(), 1u);
  const std::string twice = kvt::conn::encode(again);
  EXPECT_KVT(kvt_connector_update_connector_output(w.sched.c, twice.data(), twice.size()),
             KVT_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kvt_last_error()).find("rank 0 named store batch"), std::string::npos)
      << kvt_last_error();
  again.rank = 1;  // now as rank 1: the batch ends
  const std::string as_one = kvt::conn::encode(again);
  ASSERT_KVT_OK(kvt_connector_update_connector_output(w.sched.c, as_one.data(), as_one.size()));
  EXPECT_EQ(w.sched.stats().stored_blocks, 2u);

  auto m = make(seed_manager_config());
  kvt_connector *c = nullptr;
  kvt_connector_config cc = parallel_config(KVT_ROLE_BOTH, 0, KVT_TIER_G2);
  EXPECT_KVT(kvt_connector_create(&c, m.get(), &cc), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kvt_last_error()).find("world_size"), std::string::npos);
  cc = parallel_config(KVT_ROLE_WORKER, 2, KVT_TIER_G2);
  EXPECT_KVT(kvt_connector_create(&c, m.get(), &cc), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kvt_last_error()).find("cfg->rank is 2"), std::string::npos);
  cc.world_size = KVT_MAX_WORLD_SIZE + 1;
  cc.rank = 0;
  EXPECT_KVT(kvt_connector_create(&c, m.get(), &cc), KVT_ERR_INVALID_ARGUMENT);
  cc = connector_config();
  EXPECT_EQ(cc.world_size, 1u);
  EXPECT_EQ(cc.rank, 0u);
}

// Rank 1's G3 read fails (an injected EIO): the block leaves the scheduler's registry at
// rank 1's report, rank 1 lists its G1 block for the engine to recompute, B's stores of that
// step are never registered, and the pins go at the last report.
TEST(ConnectorParallel, ALoadThatFailsOnOneRankFailsTheBlockForAll) {
  TempDir d0, d1, ds;
  kvt_manager_config sm = seed_manager_config(0, 50, ds.path.c_str());
  kvt_manager_config w0m = seed_manager_config(0, 50, d0.path.c_str());
  kvt_manager_config w1m = seed_manager_config(0, 50, d1.path.c_str());
  w1m.g3_fault_op = KVT_G3_FAULT_READ;
  w1m.g3_fault_errno = EIO;
  w1m.g3_fault_count = 1;  // the first read of rank 1
  World w(KVT_TIER_G3, sm, w0m, w1m);
  const auto b = seed_b();
  const auto ha = hashes_of(seed_a()), hb = hashes_of(b);
  w.compute_a();
  Finished f0, f1;
  ASSERT_TRUE(w.drain_both(&f0, &f1, w.sched.counts(2, 0)));
  EXPECT_EQ(w.sched.finish("A"), 0);
  EXPECT_EQ(w.sched.held(ha, KVT_TIER_G3), 2u);

  EXPECT_EQ(w.sched.match("B", b).first, 32u);
  ASSERT_KVT_OK(w.sched.alloc("B", {4, 5, 6, 7}, 32));
  w.step(w.sched.meta({{"B", 32, 20}}), {{6, hb[2]}});
  w.report_until(1, true, &f1);
  EXPECT_FALSE(f1.load_errors.empty()) << "rank 1 lists the block its read failed";
  EXPECT_LT(w.sched.held(ha, KVT_TIER_G3), 2u) << "the failed block left at rank 1's report";
  EXPECT_EQ(w.sched.stats().load_errors, 0u) << "counted at the last rank's report";
  w.report_until(0, true, &f0);
  EXPECT_TRUE(f0.load_errors.empty());
  const kvt_connector_stats s = w.sched.stats();
  EXPECT_EQ(s.load_errors, 1u);
  EXPECT_EQ(s.loaded_blocks, 1u);
  // B's store of block 6 was computed over a block that never arrived on rank 1: doomed.
  ASSERT_TRUE(w.drain_both(&f0, &f1, [&] {
    kvt_connector_stats x = w.sched.stats();
    return x.store_failures + x.stored_blocks == 3;
  }));
  EXPECT_EQ(w.sched.stats().stored_blocks, 2u) << "only A's";
  EXPECT_EQ(w.sched.finish("B"), 0);
  EXPECT_EQ(stats(w.sched.m.get(), KVT_TIER_G3).active, 0u) << "a pin was left";
  EXPECT_KVT(kvt_manager_check(w.sched.m.get()), KVT_OK);
}
