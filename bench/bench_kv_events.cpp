// The KV-event publisher's cost to the calls that cause events (issue 14's goal: <= 1 us per
// event with one subscriber), beside the same calls without a publisher, in the same run.
// Each iteration notes the tokens of a chain of N blocks (kvt_manager_note_tokens), registers
// it in a full G1 by hash (kvt_block_register_hashes: N BlockStored, and N BlockRemoved for
// the blocks it evicts) and releases it: 2N events. A subscriber thread drains the PUB
// socket meanwhile; its counters say how many messages it got and how many sequence numbers
// it missed. Per event: Time / (2N); the publisher's cost is the difference of the two rows.
#include <benchmark/benchmark.h>
#include <stdlib.h>
#include <zmq.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "kvtier.h"

namespace {

constexpr uint32_t kPage = 16;
constexpr uint64_t kG1Blocks = 4096;

void check(kvt_status st, const char *what) {
  if (st == KVT_OK) return;
  std::fprintf(stderr, "%s: %s: %s\n", what, kvt_status_str(st), kvt_last_error());
  std::abort();
}

// Receives every message until stopped; counts them and the sequence numbers it missed.
struct Subscriber {
  void *ctx = zmq_ctx_new(), *sub = zmq_socket(ctx, ZMQ_SUB);
  std::atomic<bool> stop{false};
  uint64_t messages = 0, missed = 0;
  std::thread t;
  explicit Subscriber(const std::string &endpoint) {
    int hwm = 0;  // unbounded: count only what the publisher itself did not send
    zmq_setsockopt(sub, ZMQ_RCVHWM, &hwm, sizeof hwm);
    zmq_setsockopt(sub, ZMQ_SUBSCRIBE, "", 0);
    zmq_connect(sub, endpoint.c_str());
    int timeout = 50;
    zmq_setsockopt(sub, ZMQ_RCVTIMEO, &timeout, sizeof timeout);
    t = std::thread([this] { run(); });
  }
  void run() {
    int64_t last = -1;
    char buf[8];
    while (!stop.load(std::memory_order_relaxed)) {
      zmq_msg_t m;
      zmq_msg_init(&m);
      if (zmq_msg_recv(&m, sub, 0) < 0) {  // timeout: look at stop
        zmq_msg_close(&m);
        continue;
      }
      for (int part = 1; zmq_msg_more(&m); ++part) {
        zmq_msg_close(&m);
        zmq_msg_init(&m);
        zmq_msg_recv(&m, sub, 0);
        if (part == 1 && zmq_msg_size(&m) == 8) {
          std::memcpy(buf, zmq_msg_data(&m), 8);
          int64_t seq = 0;
          for (char c : buf) seq = seq << 8 | (unsigned char)c;
          if (last >= 0 && seq > last + 1) missed += uint64_t(seq - last - 1);
          last = seq;
        }
      }
      zmq_msg_close(&m);
      ++messages;
    }
  }
  ~Subscriber() {
    stop = true;
    t.join();
    zmq_close(sub);
    zmq_ctx_term(ctx);
  }
};

void BM_Events(benchmark::State &st) {
  const bool publish = st.range(0) != 0;
  const size_t n = size_t(st.range(1));
  char tmpl[] = "/tmp/kvt-bench-kv-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  const std::string endpoint = "ipc://" + dir + "/pub";
  kvt_manager_config c;
  kvt_manager_config_init(&c);
  c.page_size = kPage;
  c.chunk_bytes = 0;  // metadata only: the calls, not copies, are measured
  c.g1_blocks = kG1Blocks;
  c.g2_blocks = 0;
  if (publish) c.kv_events_endpoint = endpoint.c_str();
  kvt_manager *m = nullptr;
  check(kvt_manager_create(&m, &c), "kvt_manager_create");
  std::unique_ptr<Subscriber> sub;
  if (publish) {
    sub = std::make_unique<Subscriber>(endpoint);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the subscription settles
  }

  std::vector<uint32_t> tokens(n * kPage);
  std::vector<uint64_t> hashes(n);
  std::vector<kvt_block> blocks(n);
  uint64_t next = 1, events = 0;
  for (auto _ : st) {
    for (size_t i = 0; i < n; ++i) {
      hashes[i] = next++;
      for (uint32_t k = 0; k < kPage; ++k) tokens[i * kPage + k] = uint32_t(hashes[i] + k);
    }
    check(kvt_manager_note_tokens(m, hashes.data(), n, tokens.data()), "note_tokens");
    check(kvt_block_alloc(blocks.data(), n, m, KVT_TIER_G1), "alloc");
    check(kvt_block_register_hashes(blocks.data(), m, blocks.data(), hashes.data(), n, 0),
          "register");
    check(kvt_block_release(m, blocks.data(), n), "release");
    events += next > kG1Blocks ? 2 * n : n;  // once G1 is full, each block evicts one
  }
  st.SetItemsProcessed(int64_t(events));
  st.counters["ns_per_event"] = benchmark::Counter(
      double(events), benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  kvt_manager_destroy(m);  // sends what is pending
  if (sub) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    st.counters["messages"] = double(sub->messages);
    st.counters["missed_seqs"] = double(sub->missed);
  }
  std::string rm = "rm -rf " + dir;
  if (system(rm.c_str()) != 0) std::abort();
}
BENCHMARK(BM_Events)
    ->ArgNames({"publisher", "blocks"})
    ->ArgsProduct({{0, 1}, {1, 16, 64}})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
