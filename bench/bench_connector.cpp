// The connector's bookkeeping per request step, beside the bare block calls it makes, in the
// same run (issue 12's goal: overhead <= 2 us per request per step + 50 ns per block):
//   Miss/N: a request of N new blocks: get_num_new_matched_tokens (finds nothing),
//           update_state_after_alloc, build_connector_meta (plans N eager stores to G2);
//           baseline: kvt_hash_tokens + kvt_tier_match_prefix on G2 + kvt_block_alloc/release
//           of N G2 store destinations (registered, untimed, between the two, so that G2
//           fills up and allocations evict as the connector's do).
//   Hit/N:  a request whose N blocks are in G2: the same three calls (plan N loads);
//           baseline: kvt_hash_tokens + kvt_tier_match_prefix on G2 (N hits) + release.
// Only the three calls (or the baseline's) are timed. The worker's copies, the report and
// the request's end run between timed regions, so that every step starts from the same state.
//   Observed_Miss/N/MODE, Observed_Hit/N/MODE (issue 13): the same step while MODE 0 nobody
//           reads the observe stream, 1 one subscriber drains it on its own thread every
//           millisecond, 2 the event log is on (a file in /tmp), 3 the management endpoint
//           is open and no client connects (issue 25: it should cost nothing then).
//   ConnectorPair_Miss/N, ConnectorPair_Hit/N (issue 25): the step and the bare calls in
//           turns; counter over_ns_per_block = (step - bare) / N, from the two medians.
//   ObservedPair_Miss/N/MODE, ObservedPair_Hit/N/MODE (issue 25): MODE's step and the step
//           with nobody reading, on two connectors in turns; the counter ratio is their
//           medians' ratio (MODE 0, nobody on both, is the control: 1.0 but for noise).
#include <benchmark/benchmark.h>

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "kvtier.h"

namespace {

using Clock = std::chrono::steady_clock;
constexpr uint32_t kPage = 16;

// The median of v (reordered).
double median(std::vector<double> &v) {
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

// Each iteration's time, and their median as the counter p50_ns: on a shared 2-core machine a
// preempted iteration can take 100x the others, which moves the mean but not the median.
struct Times {
  benchmark::State &st;
  std::vector<double> v;
  void add(double seconds) {
    st.SetIterationTime(seconds);
    v.push_back(seconds);
  }
  ~Times() {
    if (v.empty()) return;
    st.counters["p50_ns"] = median(v) * 1e9;
    st.SetItemsProcessed(int64_t(st.iterations()));
  }
};
constexpr uint64_t kG1Blocks = 1024, kG2Blocks = 1 << 16, kChunk = 64;

void check(kvt_status st, const char *what) {
  if (st == KVT_OK) return;
  std::fprintf(stderr, "%s: %s: %s\n", what, kvt_status_str(st), kvt_last_error());
  std::abort();
}

kvt_manager *make_manager() {
  kvt_manager_config c;
  kvt_manager_config_init(&c);
  c.page_size = kPage;
  c.chunk_bytes = kChunk;  // tiny copies: the worker's part is not what is measured
  c.g1_blocks = 1;
  c.g2_blocks = kG2Blocks;
  c.g3_blocks = 0;
  c.g1_memory = KVT_MEMORY_HOST;
  kvt_manager *m = nullptr;
  check(kvt_manager_create(&m, &c), "kvt_manager_create");
  return m;
}

// Tokens of a request of n full blocks plus one token (the one the engine must compute);
// `seed` makes them differ between requests.
std::vector<uint32_t> tokens_of(size_t n, uint64_t seed) {
  std::vector<uint32_t> t(n * kPage + 1);
  for (size_t i = 0; i < t.size(); ++i) t[i] = uint32_t(seed * 2654435761u + i);
  return t;
}

// Who reads m's observe stream: nobody (0), a subscriber draining it as fast as its fd says
// there is something (1), the event log (2), or nobody, through an endpoint open on c (3).
struct Observer {
  kvt_manager *m;
  kvt_subscription *sub = nullptr;
  kvt_endpoint *endpoint = nullptr;
  std::atomic<bool> stop{false};
  std::thread reader;
  std::string log;
  uint64_t drained = 0;

  Observer(kvt_manager *mgr, kvt_connector *c, int mode) : m(mgr) {
    if (mode == 1) {
      check(kvt_subscription_create(&sub, m, 1 << 16), "kvt_subscription_create");
      reader = std::thread([this] {
        std::vector<kvt_obs_event> buf(256);
        pollfd p{kvt_subscription_fd(sub), POLLIN, 0};
        while (!stop.load()) {
          if (poll(&p, 1, 10) <= 0) continue;
          drained += kvt_subscription_drain(sub, buf.data(), buf.size());
          // Like a console or an exporter, it reads in batches: one wake-up per batch.
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
      });
    } else if (mode == 2) {
      log = "/tmp/bench_connector-" + std::to_string(getpid()) + ".kvtlog";
      check(kvt_manager_recorder_open(m, log.c_str()), "kvt_manager_recorder_open");
    } else if (mode == 3) {
      log = "/tmp/bench_connector-" + std::to_string(getpid()) + ".sock";
      check(kvt_endpoint_open(&endpoint, m, c, log.c_str()), "kvt_endpoint_open");
    }
  }
  ~Observer() {
    stop = true;
    if (reader.joinable()) reader.join();
    kvt_subscription_destroy(sub);
    if (endpoint != nullptr) {
      kvt_endpoint_close(endpoint);
    } else if (!log.empty()) {
      check(kvt_manager_recorder_close(m), "kvt_manager_recorder_close");
      std::remove(log.c_str());
    }
  }
};

// A connector of role BOTH over its own manager, with the engine's G1 registered, and the
// worker's side of a step for the untimed part.
struct Rig {
  kvt_manager *m = make_manager();
  kvt_connector *c = nullptr;
  std::vector<char> g1 = std::vector<char>(kG1Blocks * 2 * kChunk);
  std::vector<uint32_t> block_ids;
  uint64_t next_req = 0;

  Rig() {
    kvt_connector_config cc;
    kvt_connector_config_init(&cc);
    cc.num_gpu_blocks = kG1Blocks;
    check(kvt_connector_create(&c, m, &cc), "kvt_connector_create");
    const void *bases[2] = {g1.data(), g1.data() + kChunk};
    uint64_t strides[2] = {2 * kChunk, 2 * kChunk};
    kvt_g1_layout l{};
    l.struct_size = sizeof l;
    l.memory = KVT_MEMORY_HOST;
    l.bases = bases;
    l.strides = strides;
    check(kvt_connector_register_kv_caches(c, &l, kG1Blocks), "register_kv_caches");
    for (uint32_t b = 0; b < kG1Blocks; ++b) block_ids.push_back(b);
  }
  ~Rig() {
    kvt_connector_destroy(c);
    kvt_manager_destroy(m);
  }

  // One worker step over meta, and its report back to the scheduler half; true when `id`
  // was listed in finished_sending.
  bool worker_step(const void *meta, size_t len, const std::string &id) {
    check(kvt_connector_bind_connector_metadata(c, meta, len), "bind");
    check(kvt_connector_start_load_kv(c), "start_load_kv");
    check(kvt_connector_wait_for_layer_load(c, 0), "wait_for_layer_load");
    check(kvt_connector_save_kv_layer(c, 0), "save_kv_layer");
    check(kvt_connector_wait_for_save(c), "wait_for_save");
    kvt_finished f{};
    f.struct_size = sizeof f;
    check(kvt_connector_get_finished(&f, c), "get_finished");
    bool done = false;
    for (size_t k = 0; k < f.num_finished_sending; ++k) done |= id == f.finished_sending[k];
    check(kvt_connector_clear_connector_metadata(c), "clear");
    check(kvt_connector_update_connector_output(c, f.report, f.report_len), "update_output");
    return done;
  }

  // The rest of a request's life after its timed step: the worker runs the step, the
  // request finishes, and empty steps run until its stores drained.
  void finish(const void *meta, size_t len, const std::string &id) {
    worker_step(meta, len, id);
    int32_t delay = 0;
    check(kvt_connector_request_finished(&delay, c, id.c_str()), "request_finished");
    while (delay) {
      const void *m2 = nullptr;
      size_t l2 = 0;
      check(kvt_connector_build_connector_meta(&m2, &l2, c, nullptr, 0), "build (empty)");
      if (worker_step(m2, l2, id)) break;
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  // The three scheduler calls of one request step, timed; returns seconds.
  double step(const std::string &id, const std::vector<uint32_t> &tokens, size_t n_blocks,
              uint64_t expect_external) {
    const void *meta = nullptr;
    size_t len = 0;
    uint64_t ext = 0;
    int32_t async = 0;
    const auto t0 = Clock::now();
    check(kvt_connector_get_num_new_matched_tokens(&ext, &async, c, id.c_str(), tokens.data(),
                                                   tokens.size(), 0),
          "get_num_new_matched_tokens");
    check(kvt_connector_update_state_after_alloc(c, id.c_str(), block_ids.data(), n_blocks + 1,
                                                 ext),
          "update_state_after_alloc");
    kvt_scheduled_request r{id.c_str(), ext, tokens.size() - ext, nullptr, 0, nullptr, 0};
    check(kvt_connector_build_connector_meta(&meta, &len, c, &r, 1), "build_connector_meta");
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (ext != expect_external) {
      std::fprintf(stderr, "matched %llu tokens, expected %llu\n", (unsigned long long)ext,
                   (unsigned long long)expect_external);
      std::abort();
    }
    finish(meta, len, id);
    return s;
  }
};

void BM_ConnectorStep_Miss(benchmark::State &st) {
  const size_t n = size_t(st.range(0));
  Rig rig;
  Times times{st, {}};
  for (auto _ : st) {
    const uint64_t k = rig.next_req++;
    auto tokens = tokens_of(n, k + 1);
    times.add(rig.step("miss-" + std::to_string(k), tokens, n, 0));
  }
}

void BM_ConnectorStep_Hit(benchmark::State &st) {
  const size_t n = size_t(st.range(0));
  Rig rig;
  auto tokens = tokens_of(n, 0);
  rig.step("store", tokens, n, 0);  // the first request stores the N blocks in G2
  Times times{st, {}};
  for (auto _ : st) {
    const uint64_t k = rig.next_req++;
    times.add(rig.step("hit-" + std::to_string(k), tokens, n, n * kPage));
  }
}

void BM_ConnectorStepObserved_Miss(benchmark::State &st) {
  const size_t n = size_t(st.range(0));
  Rig rig;
  Observer obs(rig.m, rig.c, int(st.range(1)));
  Times times{st, {}};
  for (auto _ : st) {
    const uint64_t k = rig.next_req++;
    auto tokens = tokens_of(n, k + 1);
    times.add(rig.step("miss-" + std::to_string(k), tokens, n, 0));
  }
}

void BM_ConnectorStepObserved_Hit(benchmark::State &st) {
  const size_t n = size_t(st.range(0));
  Rig rig;
  auto tokens = tokens_of(n, 0);
  rig.step("store", tokens, n, 0);
  Observer obs(rig.m, rig.c, int(st.range(1)));
  Times times{st, {}};
  for (auto _ : st) {
    const uint64_t k = rig.next_req++;
    times.add(rig.step("hit-" + std::to_string(k), tokens, n, n * kPage));
  }
}

// One request of a pair benchmark's iteration k: Hit steps load the `stored` tokens again,
// Miss steps are new ones.
struct PairRequest {
  std::vector<uint32_t> tokens;
  std::string id;
  uint64_t ext;  // the tokens the step must find
  PairRequest(bool hit, const std::vector<uint32_t> &stored, size_t n, uint64_t k)
      : tokens(hit ? stored : tokens_of(n, k + 1)),
        id((hit ? "hit-" : "miss-") + std::to_string(k)),
        ext(hit ? n * kPage : 0) {}
};

// Times a() and b() once each, into *ta and *tb; which goes first alternates with k, so that
// neither always finds the caches the other left.
template <class A, class B>
void in_turns(uint64_t k, A &&a, B &&b, std::vector<double> *ta, std::vector<double> *tb) {
  if (k % 2 == 0) {
    ta->push_back(a());
    tb->push_back(b());
  } else {
    tb->push_back(b());
    ta->push_back(a());
  }
}

// The same step on two connectors, one with nobody reading and one with MODE's reader, taken
// in turns: each one's median, and the counter ratio = watched / plain. Drift of the machine
// (this VM's runs move by 2x) falls on both alike, which separate benchmarks do not get.
// Miss steps are new requests on both; Hit steps load the blocks each first stored.
void observed_pair(benchmark::State &st, bool hit) {
  const size_t n = size_t(st.range(0));
  Rig plain, watched;
  Observer obs(watched.m, watched.c, int(st.range(1)));
  auto stored = tokens_of(n, 0);
  if (hit)
    for (Rig *r : {&plain, &watched}) r->step("store", stored, n, 0);
  std::vector<double> p, w;
  for (auto _ : st) {
    const uint64_t k = plain.next_req++;
    const PairRequest r(hit, stored, n, k);
    in_turns(k, [&] { return plain.step(r.id, r.tokens, n, r.ext); },
             [&] { return watched.step(r.id, r.tokens, n, r.ext); }, &p, &w);
    st.SetIterationTime(w.back());
  }
  const double mp = median(p), mw = median(w);
  st.counters["plain_ns"] = mp * 1e9;
  st.counters["p50_ns"] = mw * 1e9;
  st.counters["ratio"] = mw / mp;
}
void BM_ObservedPair_Miss(benchmark::State &st) { observed_pair(st, false); }
void BM_ObservedPair_Hit(benchmark::State &st) { observed_pair(st, true); }

// The bare block calls, on a manager of the same shape without a connector.
struct Bare {
  size_t n;
  kvt_manager *m = make_manager();
  uint64_t salt = 0;
  std::vector<uint64_t> hashes;
  std::vector<kvt_block> found, dst;
  std::vector<uint32_t> hit_tokens;
  uint64_t k = 0;

  explicit Bare(size_t blocks)
      : n(blocks), hashes(blocks), found(blocks), dst(blocks), hit_tokens(tokens_of(blocks, 0)) {
    kvt_hash_salt(&salt, nullptr, 0);
  }
  ~Bare() { kvt_manager_destroy(m); }

  // A miss: hash, match (nothing), allocate N destinations; seconds.
  double miss() {
    auto tokens = tokens_of(n, ++k);
    size_t nh = 0, hit = 0;
    const auto t0 = Clock::now();
    check(kvt_hash_tokens(hashes.data(), n, &nh, salt, tokens.data(), tokens.size(), kPage),
          "hash");
    check(kvt_tier_match_prefix(&hit, found.data(), m, KVT_TIER_G2, hashes.data(), nh), "match");
    check(kvt_block_alloc(dst.data(), n, m, KVT_TIER_G2), "alloc");
    const auto t1 = Clock::now();
    // Untimed, as the connector registers its stores when the worker reports them: so that
    // G2 fills up and later allocations evict, as the connector's do.
    check(kvt_block_register_hashes(dst.data(), m, dst.data(), hashes.data(), n, 0),
          "register");
    const auto t2 = Clock::now();
    check(kvt_block_release(m, dst.data(), n), "release");
    return std::chrono::duration<double>((t1 - t0) + (Clock::now() - t2)).count();
  }
  // Puts the hit request's N blocks into G2 for hit().
  void store_hit() {
    size_t nh = 0;
    check(kvt_hash_tokens(hashes.data(), n, &nh, salt, hit_tokens.data(), hit_tokens.size(), kPage),
          "hash");
    check(kvt_block_alloc(found.data(), n, m, KVT_TIER_G2), "alloc");
    check(kvt_block_register_hashes(found.data(), m, found.data(), hashes.data(), n, 0),
          "register");
    check(kvt_block_release(m, found.data(), n), "release");
  }
  // A hit: hash, match (N in G2), release; seconds.
  double hit() {
    size_t got = 0, nh = 0;
    const auto t0 = Clock::now();
    check(kvt_hash_tokens(hashes.data(), n, &nh, salt, hit_tokens.data(), hit_tokens.size(), kPage),
          "hash");
    check(kvt_tier_match_prefix(&got, found.data(), m, KVT_TIER_G2, hashes.data(), nh), "match");
    check(kvt_block_release(m, found.data(), got), "release");
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (got != n) std::abort();
    return s;
  }
};

void BM_Baseline_BlockCalls_Miss(benchmark::State &st) {
  Bare bare(size_t(st.range(0)));
  Times times{st, {}};
  for (auto _ : st) times.add(bare.miss());
}

void BM_Baseline_BlockCalls_Hit(benchmark::State &st) {
  Bare bare(size_t(st.range(0)));
  bare.store_hit();
  Times times{st, {}};
  for (auto _ : st) times.add(bare.hit());
}

// The connector's step and the bare calls, in turns in one run (as observed_pair): their
// medians, and the counter over_ns_per_block = (connector - bare) / N, the figure of issue
// 12's goal (50 ns per block over the bare calls, plus 2 us per step).
void connector_pair(benchmark::State &st, bool hit) {
  const size_t n = size_t(st.range(0));
  Rig rig;
  Bare bare(n);
  auto stored = tokens_of(n, 0);
  if (hit) {
    rig.step("store", stored, n, 0);
    bare.store_hit();
  }
  std::vector<double> c, b;
  for (auto _ : st) {
    const uint64_t k = rig.next_req++;
    const PairRequest r(hit, stored, n, k);
    in_turns(k, [&] { return rig.step(r.id, r.tokens, n, r.ext); },
             [&] { return hit ? bare.hit() : bare.miss(); }, &c, &b);
    st.SetIterationTime(c.back());
  }
  const double mc = median(c), mb = median(b);
  st.counters["p50_ns"] = mc * 1e9;
  st.counters["bare_ns"] = mb * 1e9;
  st.counters["over_ns_per_block"] = (mc - mb) * 1e9 / double(n);
}
void BM_ConnectorPair_Miss(benchmark::State &st) { connector_pair(st, false); }
void BM_ConnectorPair_Hit(benchmark::State &st) { connector_pair(st, true); }

// Fixed iteration counts: the untimed worker part of each step dominates the wall time.
#define KVT_CONNECTOR_BENCH(fn) \
  BENCHMARK(fn)->Arg(1)->Arg(16)->Arg(256)->UseManualTime()->Iterations(4000)
KVT_CONNECTOR_BENCH(BM_ConnectorStep_Miss);
KVT_CONNECTOR_BENCH(BM_Baseline_BlockCalls_Miss);
KVT_CONNECTOR_BENCH(BM_ConnectorStep_Hit);
KVT_CONNECTOR_BENCH(BM_Baseline_BlockCalls_Hit);
KVT_CONNECTOR_BENCH(BM_ConnectorPair_Miss);
KVT_CONNECTOR_BENCH(BM_ConnectorPair_Hit);
#define KVT_OBSERVED_BENCH(fn)                                                          \
  BENCHMARK(fn)->ArgsProduct({{16, 256}, {0, 1, 2, 3}})->UseManualTime()->Iterations(4000)
KVT_OBSERVED_BENCH(BM_ConnectorStepObserved_Miss);
KVT_OBSERVED_BENCH(BM_ConnectorStepObserved_Hit);
#define KVT_PAIR_BENCH(fn)                                                              \
  BENCHMARK(fn)->ArgsProduct({{16, 256}, {0, 1, 2, 3}})->UseManualTime()->Iterations(4000)
KVT_PAIR_BENCH(BM_ObservedPair_Miss);
KVT_PAIR_BENCH(BM_ObservedPair_Hit);

}  // namespace

BENCHMARK_MAIN();
