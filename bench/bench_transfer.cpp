// Transfer benchmarks, each beside a baseline measured in the same run:
//   G1 -> G2 copies through the pipeline    vs one plain memcpy of the same total bytes;
//   G1 -> G3 writes and G3 -> G1 reads      vs dd with O_DIRECT on the same filesystem;
//   pipeline overhead per container         vs the same bookkeeping called directly;
//   cancel -> XFER_DONE latency (p50, p99)  vs the sweep interval a polling design waits.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "kvtier.h"

namespace {

using Clock = std::chrono::steady_clock;
const char *g3_dir() {
  static std::string dir = [] {
    const char *env = std::getenv("KVT_BENCH_DIR");
    std::string d = env ? env : "/var/tmp/kvtier-bench";
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir.c_str();
}

struct Setup {
  kvt_manager *m = nullptr;
  std::vector<kvt_block> g1;
  std::vector<uint64_t> hashes;
  std::vector<char> engine_mem;  // for the scattered engine layout
  ~Setup() { kvt_manager_destroy(m); }
};

// A manager whose G1 holds `blocks` registered blocks of layers x 2 x chunk bytes, filled.
// scattered: G1 is an engine layout with one region per (layer, K/V), like vLLM's per-layer
// tensors, so each block is gathered from 2 x layers chunks.
void setup(Setup &s, uint32_t layers, uint64_t chunk, uint32_t blocks, bool scattered,
           uint64_t g3_blocks, uint64_t salt) {
  kvt_manager_config c;
  kvt_manager_config_init(&c);
  c.num_layers = layers;
  c.num_outer = 2;
  c.chunk_bytes = chunk;
  c.g1_blocks = blocks;
  c.g2_blocks = blocks;
  c.g3_blocks = g3_blocks;
  c.g3_path = g3_dir();
  c.g1_memory = KVT_MEMORY_HOST;
  c.max_batch_size = 64;
  c.min_batch_size = 1;
  c.copy_threads = 2;
  c.policy_g1_g2 = c.policy_g1_g3 = c.policy_g2_g3 = {KVT_POLICY_PASS_ALL, 0};
  std::vector<const void *> bases;
  std::vector<uint64_t> strides;
  kvt_g1_layout lay{};
  if (scattered) {
    s.engine_mem.assign(size_t(layers) * 2 * blocks * chunk, 1);
    for (uint32_t i = 0; i < layers * 2; ++i) {
      bases.push_back(s.engine_mem.data() + size_t(i) * blocks * chunk);
      strides.push_back(chunk);
    }
    lay.struct_size = sizeof lay;
    lay.memory = KVT_MEMORY_HOST;
    lay.bases = bases.data();
    lay.strides = strides.data();
    c.g1_layout = &lay;
  }
  if (kvt_manager_create(&s.m, &c) != KVT_OK) {
    std::fprintf(stderr, "create: %s\n", kvt_last_error());
    std::abort();
  }
  s.g1.resize(blocks);
  kvt_block_alloc(s.g1.data(), blocks, s.m, KVT_TIER_G1);
  for (uint32_t i = 0; i < blocks; ++i) {
    s.hashes.push_back(salt * 1000003 + i + 1);
    if (!scattered) {
      void *p;
      size_t len;
      kvt_block_data(&p, &len, s.m, s.g1[i]);
      std::memset(p, int(i), len);
    }
  }
  kvt_block_register_hashes(s.g1.data(), s.m, s.g1.data(), s.hashes.data(), blocks, 0);
}

kvt_status run_xfer(kvt_xfer *x) {
  kvt_status st = kvt_xfer_wait(x, -1);
  kvt_xfer_release(x);
  return st;
}

// Times offloads of the n G1 blocks to dst, from enqueue to the end of kvt_xfer_wait. After
// each, the copies are evicted so that the next offload copies again.
void time_offloads(benchmark::State &st, Setup &s, uint32_t n, kvt_tier dst,
                   uint64_t block_bytes) {
  std::vector<kvt_event> ev(4096);
  std::vector<kvt_block> b(n);
  for (auto _ : st) {
    kvt_xfer *x = nullptr;
    auto t0 = Clock::now();
    kvt_xfer_offload(&x, s.m, s.g1.data(), n, dst, nullptr, 0);
    if (run_xfer(x) != KVT_OK) st.SkipWithError(kvt_last_error());
    st.SetIterationTime(std::chrono::duration<double>(Clock::now() - t0).count());
    kvt_block_alloc(b.data(), n, s.m, dst);
    kvt_block_release(s.m, b.data(), n);
    while (kvt_manager_poll(s.m, ev.data(), ev.size()) > 0) {
    }
  }
  st.SetBytesProcessed(int64_t(st.iterations() * n * block_bytes));
  // The copy engines' own figure, bytes over their busy time, as kvtier-replay reports it.
  kvt_transfer_stats ts{};
  ts.struct_size = sizeof ts;
  kvt_transfer_stats_get(&ts, s.m, KVT_TIER_G1, dst);
  st.counters["engine_gb_per_s"] = ts.busy_ns ? double(ts.bytes) / double(ts.busy_ns) : 0;
}

// ---- G1 -> G2 through the pipeline, and the memcpy baseline ----

void BM_OffloadG1toG2(benchmark::State &st) {
  const uint64_t chunk = uint64_t(st.range(0));
  const bool scattered = st.range(1) != 0;
  const auto layers = uint32_t(st.range(2));
  const auto n = uint32_t(st.range(3));
  Setup s;
  setup(s, layers, chunk, n, scattered, 0, 1);
  time_offloads(st, s, n, KVT_TIER_G2, uint64_t(layers) * 2 * chunk);
}
// Args: chunk bytes, scattered, layers, blocks per transfer. The last two are kvtier-replay's
// default geometry (32 KiB blocks): 1024 per transfer, over 32 MiB so that caches do not
// flatter it, and 16 per transfer, the replay's mean offload (512 KiB).
BENCHMARK(BM_OffloadG1toG2)->Args({64 << 10, 0, 32, 64})->Args({8 << 10, 0, 32, 64})
    ->Args({8 << 10, 1, 32, 64})->Args({16 << 10, 0, 1, 1024})->Args({16 << 10, 0, 1, 16})
    ->UseManualTime()->Unit(benchmark::kMillisecond);

// Args: bytes of one chunk, blocks; the same bytes as the offloads above.
void BM_Baseline_Memcpy(benchmark::State &st) {
  const size_t bytes = size_t(st.range(1)) * 32 * 2 * size_t(st.range(0));
  std::vector<char> a(bytes, 1), b(bytes, 0);
  for (auto _ : st) {
    std::memcpy(b.data(), a.data(), bytes);
    benchmark::DoNotOptimize(b.data());
  }
  st.SetBytesProcessed(int64_t(st.iterations() * bytes));
}
BENCHMARK(BM_Baseline_Memcpy)->Args({64 << 10, 64})->Args({8 << 10, 64})
    ->Args({512, 1024})->Unit(benchmark::kMillisecond);

// ---- G3: writes (offload G1 -> G3) and reads (onboard G3 -> G1) ----
// Args: layers, chunk bytes, blocks per transfer. 32 x 2 x 64 KiB = 4 MiB blocks; and
// kvtier-replay's default geometry, 1 x 2 x 16 KiB = 32 KiB blocks, 1024 per transfer.

void BM_OffloadG1toG3(benchmark::State &st) {
  const auto layers = uint32_t(st.range(0));
  const auto chunk = uint64_t(st.range(1));
  const auto n = uint32_t(st.range(2));
  Setup s;
  setup(s, layers, chunk, n, false, n, 2);
  time_offloads(st, s, n, KVT_TIER_G3, uint64_t(layers) * 2 * chunk);
}
BENCHMARK(BM_OffloadG1toG3)->Args({32, 64 << 10, 64})->Args({1, 16 << 10, 1024})
    ->UseManualTime()->Unit(benchmark::kMillisecond);

void BM_OnboardG3toG1(benchmark::State &st) {
  const auto layers = uint32_t(st.range(0));
  const auto chunk = uint64_t(st.range(1));
  const auto n = uint32_t(st.range(2));
  Setup s;
  setup(s, layers, chunk, n, false, n, 3);
  kvt_xfer *x = nullptr;
  kvt_xfer_offload(&x, s.m, s.g1.data(), n, KVT_TIER_G3, nullptr, 0);
  run_xfer(x);
  kvt_block_release(s.m, s.g1.data(), n);
  std::vector<kvt_block> src(n), dst(n);
  size_t found = 0;
  kvt_tier_match_prefix(&found, src.data(), s.m, KVT_TIER_G3, s.hashes.data(), n);
  for (auto _ : st) {
    kvt_block_alloc(dst.data(), n, s.m, KVT_TIER_G1);  // evicts the last onboard's copies
    auto t0 = Clock::now();
    kvt_xfer_onboard(&x, s.m, src.data(), dst.data(), n, nullptr, 0);
    if (kvt_xfer_wait(x, -1) != KVT_OK) st.SkipWithError(kvt_last_error());
    st.SetIterationTime(std::chrono::duration<double>(Clock::now() - t0).count());
    kvt_xfer_blocks(dst.data(), n, x);
    kvt_xfer_release(x);
    kvt_block_release(s.m, dst.data(), n);
  }
  kvt_block_release(s.m, src.data(), n);
  st.SetBytesProcessed(int64_t(st.iterations() * n * layers * 2 * chunk));
}
BENCHMARK(BM_OnboardG3toG1)->Args({32, 64 << 10, 64})->Args({1, 16 << 10, 1024})
    ->UseManualTime()->Unit(benchmark::kMillisecond);

// dd with O_DIRECT on the same filesystem as the G3 file. Args: write, block KiB, blocks:
// the same sizes as the G3 benchmarks above.
void BM_Baseline_Dd(benchmark::State &st) {
  const bool write = st.range(0) != 0;
  const std::string geometry = " bs=" + std::to_string(st.range(1)) + "K count=" +
                               std::to_string(st.range(2));
  std::string file = std::string(g3_dir()) + "/dd-baseline.bin";
  std::string wr = "dd if=/dev/zero of=" + file + geometry + " oflag=direct status=none";
  std::string rd = "dd if=" + file + " of=/dev/null" + geometry + " iflag=direct status=none";
  if (!write && std::system(wr.c_str()) != 0) st.SkipWithError("dd failed");
  for (auto _ : st) {
    auto t0 = Clock::now();
    if (std::system((write ? wr : rd).c_str()) != 0) st.SkipWithError("dd failed");
    st.SetIterationTime(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::filesystem::remove(file);
  st.SetBytesProcessed(int64_t(st.iterations() * st.range(1) * 1024 * st.range(2)));
}
BENCHMARK(BM_Baseline_Dd)->Args({1, 4096, 64})->Args({0, 4096, 64})->Args({1, 32, 1024})
    ->Args({0, 32, 1024})->UseManualTime()->Unit(benchmark::kMillisecond);

// ---- pipeline overhead: 1-block containers of 0-byte blocks, batches of 64 ----

// A manager of 0-byte blocks whose G1 holds 64 registered blocks, hashes 1..64.
kvt_manager *bookkeeping_manager(std::vector<kvt_block> *g1, std::vector<uint64_t> *h) {
  kvt_manager_config c;
  kvt_manager_config_init(&c);
  c.chunk_bytes = 0;
  c.g1_blocks = 64;
  c.g2_blocks = 64;
  c.g1_memory = KVT_MEMORY_HOST;
  c.min_batch_size = 64;
  c.policy_g1_g2 = {KVT_POLICY_PASS_ALL, 0};
  kvt_manager *m = nullptr;
  kvt_manager_create(&m, &c);
  g1->resize(64);
  h->resize(64);
  for (int i = 0; i < 64; ++i) (*h)[i] = i + 1;
  kvt_block_alloc(g1->data(), 64, m, KVT_TIER_G1);
  kvt_block_register_hashes(g1->data(), m, g1->data(), h->data(), 64, 0);
  return m;
}

void BM_PipelinePerContainer(benchmark::State &st) {
  std::vector<kvt_block> g1;
  std::vector<uint64_t> h;
  kvt_manager *m = bookkeeping_manager(&g1, &h);
  std::vector<kvt_xfer *> xs(64);
  kvt_event ev[256];
  for (auto _ : st) {
    for (int i = 0; i < 64; ++i) kvt_xfer_offload(&xs[i], m, &g1[i], 1, KVT_TIER_G2, nullptr, i);
    for (kvt_xfer *x : xs) run_xfer(x);
    while (kvt_manager_poll(m, ev, 256) > 0) {
    }
  }
  st.SetItemsProcessed(st.iterations() * 64);
  kvt_manager_destroy(m);
}
BENCHMARK(BM_PipelinePerContainer)->Unit(benchmark::kMicrosecond);

// Baseline: what a container's blocks cost without the pipeline, called directly: retain
// the source, allocate the destination, register it, release both.
void BM_Baseline_DirectBookkeeping(benchmark::State &st) {
  std::vector<kvt_block> g1;
  std::vector<uint64_t> h;
  kvt_manager *m = bookkeeping_manager(&g1, &h);
  kvt_event ev[256];
  for (auto _ : st) {
    for (int i = 0; i < 64; ++i) {
      kvt_block d;
      kvt_block_retain(m, g1[i]);
      kvt_block_alloc(&d, 1, m, KVT_TIER_G2);
      kvt_block_register_hash(&d, m, d, h[i], 0);
      kvt_block_release(m, &d, 1);
      kvt_block_release(m, &g1[i], 1);
    }
    std::vector<kvt_block> e(64);  // evict, as the pipeline run above does in effect
    kvt_block_alloc(e.data(), 64, m, KVT_TIER_G2);
    kvt_block_release(m, e.data(), 64);
    while (kvt_manager_poll(m, ev, 256) > 0) {
    }
  }
  st.SetItemsProcessed(st.iterations() * 64);
  kvt_manager_destroy(m);
}
BENCHMARK(BM_Baseline_DirectBookkeeping)->Unit(benchmark::kMicrosecond);

// ---- cancel latency of a container waiting on a fence ----

void BM_CancelLatency(benchmark::State &st) {
  kvt_manager_config c;
  kvt_manager_config_init(&c);
  c.chunk_bytes = 0;
  c.g1_memory = KVT_MEMORY_HOST;
  kvt_manager *m = nullptr;
  kvt_manager_create(&m, &c);
  kvt_block b;
  kvt_block_alloc(&b, 1, m, KVT_TIER_G1);
  kvt_block_register_hash(&b, m, b, 42, 0);
  kvt_fence *f = nullptr;
  kvt_fence_create(&f, m);
  std::vector<double> lat;
  kvt_event ev[8];
  while (kvt_manager_poll(m, ev, 8) > 0) {  // the BLOCK_STORED of the setup
  }
  for (auto _ : st) {
    kvt_xfer *x = nullptr;
    kvt_xfer_offload(&x, m, &b, 1, KVT_TIER_G2, f, 0);
    uint32_t state = 0;
    do kvt_xfer_status(&state, nullptr, nullptr, x); while (state != KVT_XFER_WAITING);
    auto t0 = Clock::now();
    kvt_xfer_cancel(x);
    size_t got = 0;
    while (got == 0) got = kvt_manager_poll(m, ev, 8);  // the host sees XFER_DONE(CANCELLED)
    auto t1 = Clock::now();
    lat.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    if (ev[0].type != KVT_EVENT_XFER_DONE || ev[0].status != KVT_ERR_CANCELLED)
      st.SkipWithError("expected XFER_DONE(CANCELLED)");
    kvt_xfer_release(x);
  }
  std::sort(lat.begin(), lat.end());
  st.counters["p50_us"] = lat[lat.size() / 2];
  st.counters["p99_us"] = lat[lat.size() * 99 / 100];
  st.counters["sweep_interval_us"] = double(c.sweep_interval_us);
  kvt_fence_destroy(f);
  kvt_manager_destroy(m);
}
BENCHMARK(BM_CancelLatency)->Iterations(2000);

}  // namespace

BENCHMARK_MAIN();
