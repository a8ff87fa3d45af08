// G4's client (src/remote, compiled in) against a redis-server this program starts, beside
// the baseline in the same run: redis-benchmark's SET/GET with the same value size and
// pipeline depth on the same server.
//   BM_G4Put/SIZE/BATCH, BM_G4Get/SIZE/BATCH: one pipelined batch of BATCH blocks per
//     iteration (one round trip), from one thread and one connection;
//   BM_RedisBenchmark/SIZE/DEPTH: `redis-benchmark -c 1 -P DEPTH -d SIZE -t set,get -n N -q`,
//     one connection too, run once and timed by its own report.
// Each reports blocks_per_s and GB_per_s (bytes of block data, 10^9 per GB); the summary at
// the end gives the client's ratio to the baseline (goal >= 0.8).
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "../tests/redis_server.hpp"
#include "remote/store.hpp"
#include "remote/value_codec.hpp"

namespace {

kvt_test::RedisServer *g_redis = nullptr;
// (size, depth, op) -> blocks/s, op 0 put/SET, 1 get/GET; for the summary.
std::map<std::tuple<int64_t, int64_t, int>, double> g_client, g_baseline;

void die(const std::string &what) {
  std::fprintf(stderr, "bench_g4: %s\n", what.c_str());
  std::exit(1);
}

std::unique_ptr<kvt::remote::Store> make_store() {
  kvt::remote::Config c;
  c.urls = {g_redis->url()};
  c.key_prefix = "kvtier-bench";
  c.ns = 1;
  c.layout = 2;
  c.timeout_us = 10000000;
  std::unique_ptr<kvt::remote::Store> s;
  if (kvt::remote::Store::create(&s, c) != KVT_OK) die("Store::create failed");
  return s;
}

struct Batch {
  std::vector<std::vector<uint8_t>> data;
  std::vector<kvt::remote::Put> puts;
  std::vector<kvt::remote::Get> gets;
  std::vector<std::vector<uint8_t>> into;
  Batch(size_t n, size_t size) {
    std::mt19937_64 rng(n * 1000003 + size);
    for (size_t i = 0; i < n; ++i) {
      data.emplace_back(size);
      for (size_t k = 0; k < size; k += 8) data.back()[k] = uint8_t(rng());
      into.emplace_back(size);
      uint64_t h = rng(), parent = i ? puts.back().hash : 0;
      puts.push_back({h, parent, data.back().data(), size});
      gets.push_back({h, parent, into.back().data(), size});
    }
  }
};

void report(benchmark::State &st, int64_t size, int64_t batch, int op) {
  st.SetItemsProcessed(st.iterations() * batch);
  st.SetBytesProcessed(st.iterations() * batch * size);
  st.counters["blocks_per_s"] = benchmark::Counter(double(st.iterations() * batch),
                                                   benchmark::Counter::kIsRate);
  st.counters["GB_per_s"] = benchmark::Counter(double(st.iterations() * batch * size) / 1e9,
                                               benchmark::Counter::kIsRate);
}

void BM_G4Put(benchmark::State &st) {
  const int64_t size = st.range(0), n = st.range(1);
  auto store = make_store();
  Batch b(static_cast<size_t>(n), static_cast<size_t>(size));
  std::vector<kvt_status> status(static_cast<size_t>(n));
  for (auto _ : st) {
    store->put(b.puts.data(), b.puts.size(), status.data());
    for (kvt_status s : status)
      if (s != KVT_OK) die("put failed");
  }
  report(st, size, n, 0);
}

void BM_G4Get(benchmark::State &st) {
  const int64_t size = st.range(0), n = st.range(1);
  auto store = make_store();
  Batch b(static_cast<size_t>(n), static_cast<size_t>(size));
  std::vector<kvt_status> status(static_cast<size_t>(n));
  store->put(b.puts.data(), b.puts.size(), status.data());
  for (auto _ : st) {
    store->get(b.gets.data(), b.gets.size());
    for (auto &g : b.gets)
      if (g.status != KVT_OK) die("get failed");
  }
  if (b.into != b.data) die("get read other bytes");
  report(st, size, n, 1);
}

// Runs `redis-benchmark -t set,get` once (its GETs read the value its SETs just wrote, so
// of this size) and times it by its own "requests per second".
void BM_RedisBenchmark(benchmark::State &st) {
  const int64_t size = st.range(0), depth = st.range(1);
  const int64_t n = std::max<int64_t>(depth * 16, (int64_t(256) << 20) / size);  // 256 MiB
  std::string cmd = "redis-benchmark -h 127.0.0.1 -p " + std::to_string(g_redis->port()) +
                    " -c 1 -P " + std::to_string(depth) + " -d " + std::to_string(size) +
                    " -n " + std::to_string(n) + " -t set,get -q 2>&1";
  double rps[2] = {0, 0};
  for (auto _ : st) {
    FILE *p = popen(cmd.c_str(), "r");
    if (p == nullptr) die("cannot run " + cmd);
    char line[512];
    std::string out;
    while (std::fgets(line, sizeof line, p)) out += line;
    if (pclose(p) != 0) die(cmd + " failed: " + out);
    // "SET: 12345.67 requests per second, p50=..." after \r-separated progress lines.
    for (int op : {0, 1}) {
      size_t at = out.rfind(op ? "GET: " : "SET: ");
      if (at == std::string::npos || (rps[op] = std::atof(out.c_str() + at + 5)) <= 0)
        die("cannot read redis-benchmark's report: " + out);
    }
    st.SetIterationTime(double(n) / rps[0] + double(n) / rps[1]);
  }
  for (int op : {0, 1}) g_baseline[{size, depth, op}] = rps[op];
  st.SetItemsProcessed(2 * n);
  st.SetBytesProcessed(2 * n * size);
  st.counters["set_blocks_per_s"] = rps[0];
  st.counters["get_blocks_per_s"] = rps[1];
  st.counters["set_GB_per_s"] = rps[0] * double(size) / 1e9;
  st.counters["get_GB_per_s"] = rps[1] * double(size) / 1e9;
}

// 32 KiB blocks in batches of 64, 2 MiB blocks in batches of 4; the baseline at the same
// depth.
void args(benchmark::internal::Benchmark *b) {
  b->Args({32 << 10, 64})->Args({2 << 20, 4});
}

// What a value's check costs, without the network: the header written and the value
// checked, with the XXH3 checksums (KEYED 0) and with a namespace's keyed BLAKE2b MAC
// (KEYED 1, g4_key_env), in the same run.
void BM_ValueCodec(benchmark::State &st) {
  const size_t size = size_t(st.range(0));
  const uint8_t key[kvt::remote::kValueKeyBytes] = {7};
  const uint8_t *k = st.range(1) ? key : nullptr;
  std::vector<uint8_t> payload(size, 0x5a);
  uint8_t header[kvt::remote::kHeaderBytes];
  const kvt::remote::ValueId id{1, 2, 3, 4};
  for (auto _ : st) {
    kvt::remote::encode_header(header, id, payload.data(), size, k);
    if (kvt::remote::check_value(header, payload.data(), size, id, k) != KVT_OK)
      die("a value just written fails its check");
  }
  st.SetBytesProcessed(int64_t(st.iterations()) * int64_t(size) * 2);  // written and read
}
BENCHMARK(BM_ValueCodec)->ArgsProduct({{32 << 10, 2 << 20}, {0, 1}});

// Wall-clock rates: the client mostly waits on the socket.
BENCHMARK(BM_G4Put)->Apply(args)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_G4Get)->Apply(args)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_RedisBenchmark)->Apply(args)->Iterations(1)->UseManualTime()->Unit(
    benchmark::kMillisecond);

// Collects blocks_per_s per benchmark for the summary, beside the normal console output.
class Collector : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run> &runs) override {
    for (const Run &r : runs) {
      // With --benchmark_repetitions the median comes last and stands.
      if (r.run_type == Run::RT_Aggregate && r.aggregate_name != "median") continue;
      std::string name = r.benchmark_name();
      auto it = r.counters.find("blocks_per_s");
      if (it == r.counters.end()) continue;
      int64_t size = 0, depth = 0;
      if (std::sscanf(name.c_str(), "BM_G4Put/%ld/%ld", &size, &depth) == 2)
        g_client[{size, depth, 0}] = it->second.value;
      else if (std::sscanf(name.c_str(), "BM_G4Get/%ld/%ld", &size, &depth) == 2)
        g_client[{size, depth, 1}] = it->second.value;
    }
    ConsoleReporter::ReportRuns(runs);
  }
};

}  // namespace

int main(int argc, char **argv) {
  benchmark::Initialize(&argc, argv);
  kvt_test::RedisServer redis;
  // No eviction in the way: 4 GiB, far above what the benchmarks write.
  if (auto r = redis.start({.maxmemory = "4gb", .policy = "allkeys-lru"}); !r)
    die(r.message());
  g_redis = &redis;
  Collector reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  std::printf("\n%-10s %-5s %-4s %14s %14s %10s %10s %7s\n", "block", "batch", "op",
              "kvtier blk/s", "redis-b blk/s", "kvtier GB/s", "redis GB/s", "ratio");
  for (auto &[k, client] : g_client) {
    auto [size, depth, op] = k;
    auto it = g_baseline.find(k);
    if (it == g_baseline.end()) continue;
    std::printf("%-10ld %-5ld %-4s %14.0f %14.0f %10.2f %10.2f %7.2f\n", long(size),
                long(depth), op ? "get" : "put", client, it->second, client * size / 1e9,
                it->second * size / 1e9, client / it->second);
  }
  benchmark::Shutdown();
  return 0;
}
