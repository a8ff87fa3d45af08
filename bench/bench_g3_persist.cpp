// Persistent G3 benchmarks, each beside its baseline in the same run:
//   warm open of a persistent G3 of 10^6 slots  vs reading the same file sequentially;
//   G1 -> G3 offload with the crash-safe record  vs today's non-persistent G3.
// The 10^6-slot file (4 GiB: metadata-only blocks, one 4 KiB slot header each) is filled
// once through the library and kept in $KVT_BENCH_DIR/g3-persist (default /var/tmp), so
// later runs reuse it: that is the feature under test.
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "kvtier.h"

namespace {

using Clock = std::chrono::steady_clock;
constexpr uint64_t kOpenSlots = 1000000;

std::string bench_dir(const char *sub) {
  const char *env = std::getenv("KVT_BENCH_DIR");
  std::string d = std::string(env ? env : "/var/tmp/kvtier-bench") + "/" + sub;
  std::filesystem::create_directories(d);
  return d;
}

void die(const char *what) {
  std::fprintf(stderr, "%s: %s\n", what, kvt_last_error());
  std::abort();
}

kvt_manager_config open_config(const std::string &dir) {
  kvt_manager_config c;
  kvt_manager_config_init(&c);
  c.num_layers = 1;
  c.num_outer = 2;
  c.chunk_bytes = 0;  // metadata only: each slot is its 4 KiB header
  c.g1_blocks = 4096;
  c.g2_blocks = 0;
  c.g3_blocks = kOpenSlots;
  c.g3_path = dir.c_str();
  c.g3_persist = 1;
  c.g3_on_mismatch = KVT_G3_RESET;
  c.g1_memory = KVT_MEMORY_HOST;
  c.max_batch_size = 256;
  c.max_concurrent_transfers = 4;
  c.policy_g1_g3 = {KVT_POLICY_PASS_ALL, 0};
  return c;
}

// Offloads `n` fresh blocks (hashes first..first+n-1) from G1 to G3, G1's size at a time.
void offload(kvt_manager *m, uint64_t first, uint64_t n, uint64_t g1) {
  std::vector<kvt_block> b(g1), reg(g1);
  std::vector<uint64_t> h(g1);
  for (uint64_t done = 0; done < n;) {
    size_t k = size_t(std::min(g1, n - done));
    if (kvt_block_alloc(b.data(), k, m, KVT_TIER_G1) != KVT_OK) die("alloc");
    for (size_t i = 0; i < k; ++i) h[i] = first + done + i;
    if (kvt_block_register_hashes(reg.data(), m, b.data(), h.data(), k, 0) != KVT_OK)
      die("register");
    kvt_xfer *x = nullptr;
    if (kvt_xfer_offload(&x, m, reg.data(), k, KVT_TIER_G3, nullptr, 0) != KVT_OK) die("offload");
    if (kvt_xfer_wait(x, -1) != KVT_OK) die("offload wait");
    kvt_xfer_release(x);
    kvt_block_release(m, reg.data(), k);
    done += k;
  }
}

uint64_t recovered(kvt_manager *m) {
  kvt_tier_stats s{};
  s.struct_size = sizeof s;
  kvt_tier_stats_get(&s, m, KVT_TIER_G3);
  return s.recovered;
}

// The 10^6-slot file, filled where an earlier run has not left it full.
const std::string &open_dir() {
  static std::string dir = [] {
    std::string d = bench_dir("g3-persist");
    kvt_manager_config c = open_config(d);
    kvt_manager *m = nullptr;
    if (kvt_manager_create(&m, &c) != KVT_OK) die("create");
    uint64_t have = recovered(m);
    if (have < kOpenSlots) {
      std::fprintf(stderr, "filling %s with %llu slots (once)...\n", d.c_str(),
                   (unsigned long long)(kOpenSlots - have));
      offload(m, uint64_t(1) << 40, kOpenSlots, c.g1_blocks);
    }
    kvt_manager_destroy(m);
    return d;
  }();
  return dir;
}

void BM_G3WarmOpen(benchmark::State &state) {
  const std::string &dir = open_dir();
  kvt_manager_config c = open_config(dir);
  for (auto _ : state) {
    auto t0 = Clock::now();
    kvt_manager *m = nullptr;
    if (kvt_manager_create(&m, &c) != KVT_OK) die("create");
    auto t1 = Clock::now();
    if (recovered(m) != kOpenSlots) {
      std::fprintf(stderr, "recovered %llu of %llu\n", (unsigned long long)recovered(m),
                   (unsigned long long)kOpenSlots);
      std::abort();
    }
    kvt_manager_destroy(m);
    state.SetIterationTime(std::chrono::duration<double>(t1 - t0).count());
  }
  state.counters["slots"] = double(kOpenSlots);
}

// Baseline: read the whole file front to back, 1 MiB at a time (page cache as it stands).
void BM_G3SequentialRead(benchmark::State &state) {
  std::string path = open_dir() + "/kvtier-g3.bin";
  std::vector<char> buf(1 << 20);
  uint64_t bytes = 0;
  for (auto _ : state) {
    auto t0 = Clock::now();
    int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) std::abort();
    bytes = 0;
    for (ssize_t r; (r = read(fd, buf.data(), buf.size())) > 0;) bytes += uint64_t(r);
    close(fd);
    state.SetIterationTime(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  state.counters["file_GiB"] = double(bytes) / double(1ull << 30);
}

// G1 -> G3 offload of 256 fresh blocks of 4 layers x 2 x 32 KiB (256 KiB) per iteration;
// persist 0: today's G3, 1: the crash-safe path (record cleared, written, set per slot).
void BM_G3Write(benchmark::State &state) {
  const bool persist = state.range(0) != 0;
  std::string dir = bench_dir(persist ? "g3-write-persist" : "g3-write");
  kvt_manager_config c;
  kvt_manager_config_init(&c);
  c.num_layers = 4;
  c.num_outer = 2;
  c.chunk_bytes = 32 << 10;
  c.g1_blocks = 256;
  c.g2_blocks = 0;
  c.g3_blocks = 1024;
  c.g3_path = dir.c_str();
  c.g3_persist = persist;
  c.g3_on_mismatch = KVT_G3_RESET;
  c.g1_memory = KVT_MEMORY_HOST;
  c.max_batch_size = 64;
  c.min_batch_size = 1;
  c.copy_threads = 2;
  c.policy_g1_g3 = {KVT_POLICY_PASS_ALL, 0};
  kvt_manager *m = nullptr;
  if (kvt_manager_create(&m, &c) != KVT_OK) die("create");
  uint64_t next = uint64_t(1) << 32;
  for (auto _ : state) {
    offload(m, next, c.g1_blocks, c.g1_blocks);
    next += c.g1_blocks;
  }
  kvt_manager_destroy(m);
  if (persist) std::filesystem::remove(dir + "/kvtier-g3.bin");
}

}  // namespace

BENCHMARK(BM_G3WarmOpen)->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(3);
BENCHMARK(BM_G3SequentialRead)->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(3);
BENCHMARK(BM_G3Write)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->MinTime(0.5)->UseRealTime();

BENCHMARK_MAIN();
