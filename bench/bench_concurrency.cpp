// Concurrent transfers: k transfers in flight on a manager with max_concurrent_transfers = k,
// for k = 1, 2, 4, each beside the same bytes copied in the same run by k plain workers:
//   G1 -> G2 through the pipeline   vs k threads each memcpy-ing one transfer's bytes;
//   G2 -> G3 through the pipeline   vs k concurrent `dd oflag=direct` of the same bytes,
//                                     to files in the G3 file's directory.
// Each transfer is 1024 blocks of 1 x 2 x 16 KiB (kvtier-replay's geometry), 32 MiB.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "kvtier.h"

namespace {

using Clock = std::chrono::steady_clock;
constexpr uint32_t kBlocks = 1024;           // per transfer
constexpr uint64_t kChunk = 16 << 10;        // 1 layer x K/V x 16 KiB = 32 KiB blocks
constexpr uint64_t kBlockBytes = 2 * kChunk;
constexpr uint32_t kCopyThreads = 2;         // the pool every transfer splits its copy over

const std::string &bench_dir() {
  static std::string dir = [] {
    const char *env = std::getenv("KVT_BENCH_DIR");
    std::string d = env ? env : "/var/tmp/kvtier-bench";
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

void die(const char *what) {
  std::fprintf(stderr, "%s: %s\n", what, kvt_last_error());
  std::abort();
}

// A manager with k executors whose tier `src` holds k * kBlocks registered, filled blocks.
struct Setup {
  kvt_manager *m = nullptr;
  std::vector<kvt_block> src;
  ~Setup() { kvt_manager_destroy(m); }
  Setup(uint32_t k, kvt_tier src_tier, kvt_tier dst_tier) {
    const uint32_t n = k * kBlocks;
    kvt_manager_config c;
    kvt_manager_config_init(&c);
    c.num_layers = 1;
    c.num_outer = 2;
    c.chunk_bytes = kChunk;
    c.g1_blocks = n;
    c.g2_blocks = n;
    c.g3_blocks = dst_tier == KVT_TIER_G3 ? n : 0;
    c.g3_path = bench_dir().c_str();
    c.g1_memory = KVT_MEMORY_HOST;
    c.max_concurrent_transfers = k;
    c.copy_threads = kCopyThreads;
    c.max_batch_size = kBlocks;  // one transfer per batch, so k batches run at once
    c.min_batch_size = 1;
    c.event_capacity = 4 * n;
    c.policy_g1_g2 = c.policy_g1_g3 = c.policy_g2_g3 = {KVT_POLICY_PASS_ALL, 0};
    if (kvt_manager_create(&m, &c) != KVT_OK) die("create");
    src.resize(n);
    if (kvt_block_alloc(src.data(), n, m, src_tier) != KVT_OK) die("alloc");
    std::vector<uint64_t> hashes(n);
    for (uint32_t i = 0; i < n; ++i) {
      hashes[i] = 0x9e3779b97f4a7c15ull * (i + 1);
      void *p;
      size_t len;
      if (kvt_block_data(&p, &len, m, src[i]) != KVT_OK) die("block data");
      std::memset(p, int(i), len);
    }
    if (kvt_block_register_hashes(src.data(), m, src.data(), hashes.data(), n, 0) != KVT_OK)
      die("register");
  }
};

// k offloads of kBlocks each, all enqueued at once; timed from the first enqueue until the
// last has been waited for. Afterwards the copies are evicted, so every iteration copies. One
// untimed round first touches every page of both tiers.
void BM_Concurrent(benchmark::State &st, kvt_tier src_tier, kvt_tier dst_tier) {
  const auto k = uint32_t(st.range(0));
  Setup s(k, src_tier, dst_tier);
  std::vector<kvt_xfer *> xs(k);
  std::vector<kvt_block> evict(k * kBlocks);
  std::vector<kvt_event> ev(8192);
  auto round = [&] {
    auto t0 = Clock::now();
    for (uint32_t i = 0; i < k; ++i)
      if (kvt_xfer_offload(&xs[i], s.m, s.src.data() + i * kBlocks, kBlocks, dst_tier, nullptr, i))
        die("offload");
    bool ok = true;
    for (kvt_xfer *x : xs) {
      ok = kvt_xfer_wait(x, -1) == KVT_OK && ok;
      kvt_xfer_release(x);
    }
    double t = std::chrono::duration<double>(Clock::now() - t0).count();
    if (kvt_block_alloc(evict.data(), evict.size(), s.m, dst_tier) != KVT_OK) die("evict");
    kvt_block_release(s.m, evict.data(), evict.size());
    while (kvt_manager_poll(s.m, ev.data(), ev.size()) > 0) {
    }
    return ok ? t : -1.0;
  };
  round();
  for (auto _ : st) {
    double t = round();
    if (t < 0) st.SkipWithError(kvt_last_error());
    st.SetIterationTime(t);
  }
  st.SetBytesProcessed(int64_t(st.iterations() * k * kBlocks * kBlockBytes));
}
void BM_ConcurrentG1toG2(benchmark::State &st) { BM_Concurrent(st, KVT_TIER_G1, KVT_TIER_G2); }
void BM_ConcurrentG2toG3(benchmark::State &st) { BM_Concurrent(st, KVT_TIER_G2, KVT_TIER_G3); }
BENCHMARK(BM_ConcurrentG1toG2)->Arg(1)->Arg(2)->Arg(4)->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ConcurrentG2toG3)->Arg(1)->Arg(2)->Arg(4)->UseManualTime()
    ->Unit(benchmark::kMillisecond);

// Baseline: k threads, each copying one transfer's bytes with one plain memcpy.
void BM_Baseline_MemcpyThreads(benchmark::State &st) {
  const auto k = size_t(st.range(0));
  const size_t bytes = kBlocks * kBlockBytes;
  std::vector<std::vector<char>> a(k, std::vector<char>(bytes, 1)), b(k, std::vector<char>(bytes));
  for (auto _ : st) {
    auto t0 = Clock::now();
    std::vector<std::thread> ts;
    for (size_t i = 0; i < k; ++i)
      ts.emplace_back([&, i] { std::memcpy(b[i].data(), a[i].data(), bytes); });
    for (auto &t : ts) t.join();
    st.SetIterationTime(std::chrono::duration<double>(Clock::now() - t0).count());
    benchmark::DoNotOptimize(b[0].data());
  }
  st.SetBytesProcessed(int64_t(st.iterations() * k * bytes));
}
BENCHMARK(BM_Baseline_MemcpyThreads)->Arg(1)->Arg(2)->Arg(4)->UseManualTime()
    ->Unit(benchmark::kMillisecond);

// Baseline: k concurrent dd processes, each writing one transfer's bytes with O_DIRECT in
// 32 KiB writes to its own file beside the G3 file.
void BM_Baseline_DdConcurrent(benchmark::State &st) {
  const auto k = int(st.range(0));
  std::string cmd;
  for (int i = 0; i < k; ++i)
    cmd += "dd if=/dev/zero of=" + bench_dir() + "/dd-concurrent-" + std::to_string(i) +
           ".bin bs=" + std::to_string(kBlockBytes >> 10) + "K count=" + std::to_string(kBlocks) +
           " oflag=direct status=none & ";
  cmd = "sh -c '" + cmd + "wait'";
  for (auto _ : st) {
    auto t0 = Clock::now();
    if (std::system(cmd.c_str()) != 0) st.SkipWithError("dd failed");
    st.SetIterationTime(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  for (int i = 0; i < k; ++i)
    std::filesystem::remove(bench_dir() + "/dd-concurrent-" + std::to_string(i) + ".bin");
  st.SetBytesProcessed(int64_t(st.iterations() * k * kBlocks * kBlockBytes));
}
BENCHMARK(BM_Baseline_DdConcurrent)->Arg(1)->Arg(2)->Arg(4)->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
