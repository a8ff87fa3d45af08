// Seed 003 through the connector, with assertions: the canonical scenario (A computes and is
// stored, B loads A's prefix from G2 and computes the rest), then lazy offload, a preemption
// in the middle of B, B finished while its load is in flight, the scheduler and the worker
// in two processes, and a G3 block that fails its checksum.
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>

#include "connector_support.hpp"

using namespace kvt_conn_test;

namespace {

constexpr uint32_t I = KVT_SLOT_INITIALIZED, OS = KVT_SLOT_ONBOARD_STAGED,
                   OB = KVT_SLOT_ONBOARDING, PF = KVT_SLOT_PREFILLING, DC = KVT_SLOT_DECODING,
                   PE = KVT_SLOT_PREEMPTED, FG = KVT_SLOT_FINISHING, FD = KVT_SLOT_FINISHED;

uint64_t g2_active(kvt_manager *m) { return stats(m, KVT_TIER_G2).active; }

kvt_status report_to(Rig &r, const std::string &report) {
  return kvt_connector_update_connector_output(r.c, report.data(), report.size());
}

}  // namespace

TEST(ConnectorSeed003, OneProcess) {
  Rig r;
  auto a = seed_a(), b = seed_b();
  auto ha = hashes_of(a), hb = hashes_of(b);
  ASSERT_EQ(ha.size(), 2u);
  ASSERT_EQ(hb.size(), 3u);
  ASSERT_EQ(ha[1], hb[1]);

  // A: nothing to load; its step computes blocks 1 and 2, which are stored to G2.
  EXPECT_EQ(r.match("A", a), std::make_pair(uint64_t{0}, int32_t{0}));
  EXPECT_EQ(history(r.c, "A"), names({I}));
  ASSERT_KVT_OK(r.alloc("A", {1, 2, 3}, 0));
  EXPECT_EQ(slot_state(r.c, "A"), I);
  r.step(r.meta({{"A", 0, 40}}), {{1, ha[0]}, {2, ha[1]}}, r.counts(2, 0));
  EXPECT_EQ(slot_state(r.c, "A"), PF);
  EXPECT_EQ(r.g2_holding(ha), 2u);
  EXPECT_EQ(r.finish("A"), 0);
  EXPECT_EQ(history(r.c, "A"), names({I, PF, FG, FD}));

  // B: A's two blocks are loaded into B's blocks 4 and 5; B computes block 6.
  EXPECT_EQ(r.match("B", b), std::make_pair(uint64_t{32}, int32_t{0}));
  EXPECT_EQ(history(r.c, "B"), names({I, OS}));
  ASSERT_KVT_OK(r.alloc("B", {4, 5, 6, 7}, 32));
  EXPECT_EQ(slot_state(r.c, "B"), OB);
  bool loaded = false;
  Finished f = r.step(r.meta({{"B", 32, 20}}), {{6, hb[2]}}, r.counts(3, 2), [&] {
    loaded = std::memcmp(r.g1.block(4), r.g1.block(1), 2 * kBlock) == 0 &&
             r.g1.holds(4, ha[0]) && r.g1.holds(5, ha[1]);
  });
  EXPECT_TRUE(loaded) << "B's blocks 4 and 5 do not hold A's bytes after wait_for_layer_load";
  EXPECT_TRUE(f.recving.empty()) << "a load the engine waited for in its step is not listed";
  EXPECT_TRUE(f.load_errors.empty());
  EXPECT_TRUE(r.g1.holds(1, ha[0]) && r.g1.holds(2, ha[1])) << "A's blocks were written";
  EXPECT_EQ(uint64_t(std::count(r.g1.block(7), r.g1.block(8), 0)), kBlock)
      << "a partial block was written";

  // B decodes one token: nothing to load or store.
  r.step(r.meta({{"B", 52, 1, {}, {3000}}}), {}, r.counts(3, 2));
  EXPECT_EQ(slot_state(r.c, "B"), DC);
  EXPECT_EQ(r.finish("B"), 0);
  EXPECT_EQ(history(r.c, "B"), names({I, OS, OB, PF, DC, FG, FD}));

  // G2 holds B's three blocks with the engine's bytes, and nothing is pinned any more.
  EXPECT_EQ(stats(r.m.get(), KVT_TIER_G2).registered, 3u);
  EXPECT_EQ(r.g2_holding(hb), 3u);
  EXPECT_EQ(g2_active(r.m.get()), 0u);
  EXPECT_KVT(kvt_manager_check(r.m.get()), KVT_OK);

  kvt_connector_stats s = r.stats();
  EXPECT_EQ(s.stored_blocks, 3u);
  EXPECT_EQ(s.loaded_blocks, 2u);
  EXPECT_EQ(s.matched_tokens, 32u);
  EXPECT_EQ(s.load_errors, 0u);
  EXPECT_EQ(s.store_failures, 0u);
  EXPECT_EQ(s.preemptions, 0u);
  EXPECT_EQ(s.transitions[0][I], 2u);
  EXPECT_EQ(s.transitions[I][PF], 1u);
  EXPECT_EQ(s.transitions[I][OS], 1u);
  EXPECT_EQ(s.transitions[OS][OB], 1u);
  EXPECT_EQ(s.transitions[OB][PF], 1u);
  EXPECT_EQ(s.transitions[PF][DC], 1u);
  EXPECT_EQ(s.transitions[PF][FG], 1u);
  EXPECT_EQ(s.transitions[DC][FG], 1u);
  EXPECT_EQ(s.transitions[FG][FD], 2u);

  // The worker's copies count in kvt_transfer_stats too: one transfer per batch and tier.
  kvt_transfer_stats out = xfer_stats(r.m.get(), KVT_TIER_G1, KVT_TIER_G2);
  kvt_transfer_stats in = xfer_stats(r.m.get(), KVT_TIER_G2, KVT_TIER_G1);
  EXPECT_EQ(out.blocks, s.stored_blocks);
  EXPECT_EQ(in.blocks, s.loaded_blocks);
  EXPECT_EQ(in.bytes, in.blocks * kBlock);
  EXPECT_GE(out.completed, 2u);  // A's stores, then B's
  EXPECT_EQ(in.completed, 1u);   // B's load
  EXPECT_EQ(out.failed + out.cancelled + in.failed + in.cancelled, 0u);
  EXPECT_GT(in.busy_ns, 0u);

  // Finished slots are gone for every call but slot_state.
  int32_t delay = -1;
  EXPECT_KVT(kvt_connector_request_finished(&delay, r.c, "A"), KVT_ERR_NOT_FOUND);
  EXPECT_EQ(delay, -1);
  EXPECT_EQ(slot_state(r.c, "B"), FD);
}

// Lazy offload: nothing is stored while A's G1 blocks keep their bytes. When the engine hands
// them to C for writing, the worker copies them out before C's forward overwrites them, and
// B then finds A's prefix in G2 with A's bytes.
TEST(ConnectorSeed003, LazyOffload) {
  Rig r(connector_config(KVT_ROLE_BOTH, KVT_OFFLOAD_LAZY));
  auto a = seed_a(), b = seed_b(), c = token_range(5000, 40);
  auto ha = hashes_of(a), hb = hashes_of(b), hc = hashes_of(c);
  r.run_a(0);
  EXPECT_EQ(r.stats().stored_blocks, 0u);
  EXPECT_EQ(stats(r.m.get(), KVT_TIER_G2).registered, 0u);
  EXPECT_EQ(r.match("B0", b).first, 0u) << "lazy offload stored A before its blocks were reused";
  EXPECT_EQ(r.finish("B0"), 0);

  // C reuses A's blocks 1, 2 and 3.
  EXPECT_EQ(r.match("C", c).first, 0u);
  ASSERT_KVT_OK(r.alloc("C", {1, 2, 3}, 0));
  bool intact = false;
  r.step(r.meta({{"C", 0, 40}}), {{1, hc[0]}, {2, hc[1]}}, r.counts(2, 0),
         [&] { intact = r.g1.holds(1, ha[0]) && r.g1.holds(2, ha[1]); });
  EXPECT_TRUE(intact) << "A's blocks changed before C's forward";
  EXPECT_EQ(r.g2_holding(ha), 2u) << "G2 lacks A's bytes";
  EXPECT_EQ(r.held(hc), 0u) << "lazy offload stored C's blocks while they are in use";
  EXPECT_EQ(r.finish("C"), 0);

  EXPECT_EQ(r.match("B", b).first, 32u);
  ASSERT_KVT_OK(r.alloc("B", {4, 5, 6, 7}, 32));
  bool loaded = false;
  r.step(r.meta({{"B", 32, 20}}), {{6, hb[2]}}, r.counts(2, 2),
         [&] { loaded = r.g1.holds(4, ha[0]) && r.g1.holds(5, ha[1]); });
  EXPECT_TRUE(loaded);
  EXPECT_EQ(r.finish("B"), 0);
  EXPECT_EQ(history(r.c, "B"), names({I, OS, OB, PF, FG, FD}));
  EXPECT_EQ(r.held(hb), 2u) << "B's own block was stored although it was never reused";
  EXPECT_EQ(g2_active(r.m.get()), 0u);
  EXPECT_KVT(kvt_manager_check(r.m.get()), KVT_OK);
}

// vLLM writes each layer's new KV before that layer's wait_for_layer_load (attention.py's
// unified_kv_cache_update comes before maybe_transfer_kv_layer): A's blocks, reused by C and
// lazily stored, must be out of G1 by the time start_load_kv returns.
TEST(ConnectorSeed003, LazyStoresEndBeforeStartLoadKvReturns) {
  Rig r(connector_config(KVT_ROLE_BOTH, KVT_OFFLOAD_LAZY));
  auto c = token_range(5000, 40);
  auto ha = hashes_of(seed_a()), hc = hashes_of(c);
  r.run_a(0);
  EXPECT_EQ(r.match("C", c).first, 0u);
  ASSERT_KVT_OK(r.alloc("C", {1, 2, 3}, 0));
  const std::string meta = r.meta({{"C", 0, 40}});
  ASSERT_KVT_OK(kvt_connector_bind_connector_metadata(r.c, meta.data(), meta.size()));
  ASSERT_KVT_OK(kvt_connector_start_load_kv(r.c));
  r.g1.write(1, hc[0]);  // the first layer's new KV, before any wait
  r.g1.write(2, hc[1]);
  for (uint32_t l = 0; l < kLayers; ++l) ASSERT_KVT_OK(kvt_connector_wait_for_layer_load(r.c, l));
  for (uint32_t l = 0; l < kLayers; ++l) ASSERT_KVT_OK(kvt_connector_save_kv_layer(r.c, l));
  ASSERT_KVT_OK(kvt_connector_wait_for_save(r.c));
  Finished acc;
  EXPECT_TRUE(drain(r.c, r.c, &acc, r.counts(2, 0)));
  ASSERT_KVT_OK(kvt_connector_clear_connector_metadata(r.c));
  EXPECT_EQ(r.g2_holding(ha), 2u) << "G2 holds what C's forward wrote over A's blocks";
  EXPECT_EQ(r.finish("C"), 0);
  EXPECT_KVT(kvt_manager_check(r.m.get()), KVT_OK);
}

// A reset with lazy offload: what G1 still holds from before the reset is not stored when the
// engine reuses its blocks, and a reset while a load is in flight is refused and changes
// nothing (the load would bring the old KV back into G1).
TEST(ConnectorSeed003, ResetCacheWithLazyOffloadAndLoadsInFlight) {
  Rig r(connector_config(KVT_ROLE_BOTH, KVT_OFFLOAD_LAZY));
  auto a = seed_a(), b = seed_b(), c = token_range(5000, 40);
  auto ha = hashes_of(a), hc = hashes_of(c);
  r.run_a(0);
  ASSERT_KVT_OK(kvt_connector_reset_cache(r.c));
  EXPECT_EQ(r.match("C", c).first, 0u);
  ASSERT_KVT_OK(r.alloc("C", {1, 2, 3}, 0));  // A's blocks, reused
  r.step(r.meta({{"C", 0, 40}}), {{1, hc[0]}, {2, hc[1]}});
  EXPECT_EQ(r.held(ha), 0u) << "a lazy store brought A's blocks from before the reset";
  EXPECT_EQ(r.finish("C"), 0);
  EXPECT_EQ(r.match("B", b).first, 0u);
  EXPECT_EQ(r.finish("B"), 0);

  // C's blocks 1 and 2, stored lazily once reused, are loaded by D; the reset waits for it.
  auto d = token_range(7000, 40);
  EXPECT_EQ(r.match("D", d).first, 0u);
  ASSERT_KVT_OK(r.alloc("D", {1, 2, 3}, 0));
  r.step(r.meta({{"D", 0, 40}}), {}, [&] { return r.held(hc) == 2; });
  EXPECT_EQ(r.finish("D"), 0);
  EXPECT_EQ(r.match("E", c).first, 32u);
  ASSERT_KVT_OK(r.alloc("E", {10, 11, 12}, 32));
  std::string meta = r.meta({{"E", 32, 8}});  // E's load is in flight
  EXPECT_KVT(kvt_connector_reset_cache(r.c), KVT_ERR_STATE);
  EXPECT_NE(std::string(kvt_last_error()).find("loads are in flight"), std::string::npos);
  EXPECT_EQ(r.held(hc), 2u) << "a refused reset changed the registry";
  r.step(meta, {}, r.counts(r.stats().stored_blocks, 2));
  ASSERT_KVT_OK(kvt_connector_reset_cache(r.c));
  EXPECT_EQ(r.held(hc), 0u);
  EXPECT_EQ(r.finish("E"), 0);
  EXPECT_KVT(kvt_manager_check(r.m.get()), KVT_OK);
}

// B prefills in two chunks and is preempted after the first. It comes back, onboards again
// into other G1 blocks, and its bytes are still right; the blocks it gave back stay as the
// engine left them.
TEST(ConnectorSeed003, PreemptedInTheMiddleOfB) {
  Rig r;
  auto b = seed_b();
  auto ha = hashes_of(seed_a()), hb = hashes_of(b);
  r.run_a();

  EXPECT_EQ(r.match("B", b).first, 32u);
  ASSERT_KVT_OK(r.alloc("B", {4, 5, 6, 7}, 32));
  bool loaded = false;
  r.step(r.meta({{"B", 32, 8}}), {}, r.counts(2, 2),
         [&] { loaded = r.g1.holds(4, ha[0]) && r.g1.holds(5, ha[1]); });
  EXPECT_TRUE(loaded);
  EXPECT_EQ(slot_state(r.c, "B"), PF);

  ASSERT_KVT_OK(kvt_connector_request_preempted(r.c, "B"));
  EXPECT_EQ(slot_state(r.c, "B"), PE);
  const char *ids[] = {"B"};
  ASSERT_KVT_OK(kvt_connector_handle_preemptions(r.c, ids, 1));
  for (uint32_t blk = 4; blk < 8; ++blk) r.g1.fill(blk, 0xEE);  // the engine reuses them

  EXPECT_EQ(r.match("B", b), std::make_pair(uint64_t{32}, int32_t{0}));
  EXPECT_EQ(slot_state(r.c, "B"), OS);
  ASSERT_KVT_OK(r.alloc("B", {10, 11, 12, 13}, 32));
  loaded = false;
  r.step(r.meta({{"B", 32, 20}}), {{12, hb[2]}}, r.counts(3, 4),
         [&] { loaded = r.g1.holds(10, ha[0]) && r.g1.holds(11, ha[1]); });
  EXPECT_TRUE(loaded) << "B's second load did not bring A's bytes";
  for (uint32_t blk = 4; blk < 8; ++blk)
    EXPECT_EQ(uint64_t(std::count(r.g1.block(blk), r.g1.block(blk + 1), 0xEE)), kBlock)
        << "block " << blk << " was written after B gave it back";
  EXPECT_EQ(r.finish("B"), 0);
  EXPECT_EQ(history(r.c, "B"), names({I, OS, OB, PF, PE, OS, OB, PF, FG, FD}));
  EXPECT_EQ(r.stats().preemptions, 1u);
  EXPECT_EQ(r.stats().transitions[PE][OS], 1u);
  EXPECT_EQ(r.g2_holding(hb), 3u);
  EXPECT_EQ(g2_active(r.m.get()), 0u);
  EXPECT_KVT(kvt_manager_check(r.m.get()), KVT_OK);
}

// Asynchronous loads: B waits for its load outside the schedule (finished_recving), then is
// scheduled and computes the rest.
TEST(ConnectorSeed003, AsyncLoad) {
  Rig r(connector_config(KVT_ROLE_BOTH, KVT_OFFLOAD_EAGER, KVT_TIER_G2, 1));
  auto b = seed_b();
  auto ha = hashes_of(seed_a()), hb = hashes_of(b);
  r.run_a();
  EXPECT_EQ(r.match("B", b), std::make_pair(uint64_t{32}, int32_t{1}));
  ASSERT_KVT_OK(r.alloc("B", {4, 5, 6, 7}, 32));
  Finished f = r.step(r.meta({}), {}, [&] { return r.stats().loaded_blocks == 2; });
  EXPECT_EQ(slot_state(r.c, "B"), OB) << "a request waiting for its load is not skipped";
  EXPECT_TRUE(f.received("B"));
  EXPECT_TRUE(r.g1.holds(4, ha[0]) && r.g1.holds(5, ha[1]));
  r.step(r.meta({{"B", 32, 20}}), {{6, hb[2]}}, r.counts(3, 2));
  EXPECT_EQ(r.finish("B"), 0);
  EXPECT_EQ(history(r.c, "B"), names({I, OS, OB, PF, FG, FD}));
  EXPECT_EQ(r.g2_holding(hb), 3u);
}

// B is finished while its asynchronous load is in flight. vLLM keeps the blocks of a request
// that waits for remote KV until its finished_recving, and frees it there: B gets delay_free
// 0, reaches finished_recving exactly once and finished_sending never, whatever the timing;
// the slot ends FINISHED with every pin dropped.
TEST(ConnectorSeed003, FinishedWhileLoadInFlight) {
  Rig r(connector_config(KVT_ROLE_BOTH, KVT_OFFLOAD_EAGER, KVT_TIER_G2, 1));
  auto b = seed_b();
  auto ha = hashes_of(seed_a());
  r.run_a();
  EXPECT_EQ(r.match("B", b), std::make_pair(uint64_t{32}, int32_t{1}));
  ASSERT_KVT_OK(r.alloc("B", {4, 5, 6, 7}, 32));

  Finished f;
  ASSERT_KVT_OK(worker_step(r.c, r.g1, r.meta({}), {}));
  EXPECT_EQ(r.finish("B"), 0) << "vLLM waits for B's finished_recving, not finished_sending";
  EXPECT_EQ(slot_state(r.c, "B"), FG);
  EXPECT_TRUE(drain(r.c, r.c, &f, [&] { return r.stats().loaded_blocks == 2; }));
  ASSERT_KVT_OK(kvt_connector_clear_connector_metadata(r.c));
  // More steps: nothing more about B may come.
  for (int i = 0; i < 3; ++i) {
    ASSERT_KVT_OK(worker_step(r.c, r.g1, r.meta({}), {}));
    drain(r.c, r.c, &f, [] { return true; });
    ASSERT_KVT_OK(kvt_connector_clear_connector_metadata(r.c));
  }
  EXPECT_EQ(std::count(f.recving.begin(), f.recving.end(), "B"), 1);
  EXPECT_FALSE(f.sent("B")) << "vLLM frees B at finished_recving; a finished_sending after it "
                               "fails its assert";
  EXPECT_EQ(slot_state(r.c, "B"), FD);
  EXPECT_EQ(history(r.c, "B"), names({I, OS, OB, FG, FD}));
  EXPECT_EQ(r.stats().transitions[FG][FD], 2u);  // A's and B's
  EXPECT_EQ(g2_active(r.m.get()), 0u) << "the load's sources are still pinned";
  EXPECT_KVT(kvt_manager_check(r.m.get()), KVT_OK);
  EXPECT_EQ(r.held(ha), 2u) << "A's blocks left G2";
  int32_t delay;
  EXPECT_KVT(kvt_connector_request_finished(&delay, r.c, "B"), KVT_ERR_NOT_FOUND);
}

// --- two processes ---

namespace {

// Frames on a stream socket: a kind byte, a 64-bit length, the payload.
bool write_all(int fd, const void *p, size_t n) {
  for (auto *c = static_cast<const char *>(p); n > 0;) {
    ssize_t w = ::write(fd, c, n);
    if (w <= 0) return false;
    c += w;
    n -= size_t(w);
  }
  return true;
}
bool read_all(int fd, void *p, size_t n) {
  for (auto *c = static_cast<char *>(p); n > 0;) {
    ssize_t r = ::read(fd, c, n);
    if (r <= 0) return false;
    c += r;
    n -= size_t(r);
  }
  return true;
}
bool send_frame(int fd, char kind, const std::string &payload) {
  uint64_t len = payload.size();
  return write_all(fd, &kind, 1) && write_all(fd, &len, 8) &&
         write_all(fd, payload.data(), payload.size());
}
bool recv_frame(int fd, char *kind, std::string *payload) {
  uint64_t len = 0;
  if (!read_all(fd, kind, 1) || !read_all(fd, &len, 8) || len > (64u << 20)) return false;
  payload->resize(len);
  return read_all(fd, payload->data(), len);
}

struct Out {
  std::string s;
  void u32(uint32_t v) { s.append(reinterpret_cast<const char *>(&v), 4); }
  void u64(uint64_t v) { s.append(reinterpret_cast<const char *>(&v), 8); }
  void str(const std::string &v) {
    u64(v.size());
    s += v;
  }
  void pairs(const Forward &f) {
    u32(uint32_t(f.size()));
    for (auto [b, h] : f) {
      u32(b);
      u64(h);
    }
  }
};
struct In {
  const std::string &s;
  size_t pos = 0;
  bool ok = true;
  void take(void *p, size_t n) {
    if (!ok || s.size() - pos < n) {
      ok = false;
      std::memset(p, 0, n);
      return;
    }
    std::memcpy(p, s.data() + pos, n);
    pos += n;
  }
  uint32_t u32() {
    uint32_t v;
    take(&v, 4);
    return v;
  }
  uint64_t u64() {
    uint64_t v;
    take(&v, 8);
    return v;
  }
  std::string str() {
    uint64_t n = u64();
    if (!ok || s.size() - pos < n) {
      ok = false;
      return "";
    }
    std::string v = s.substr(pos, n);
    pos += n;
    return v;
  }
  Forward pairs() {
    Forward f(u32());
    for (auto &[b, h] : f) {
      b = u32();
      h = u64();
    }
    return f;
  }
};

// The worker process: its own manager (seed 003's shape) and a WORKER connector over the
// engine's G1. It serves the parent's frames:
//   'S' step: checks, forward, metadata -> 'A' status, blocks that held the checked KV
//   'P' poll: one get_finished -> 'F' report, finished_sending, finished_recving, errors
//   'C' clear_connector_metadata -> 'A' status
//   'Q' quit
// Returns the process's exit status: 0 when every call and every check succeeded.
int worker_process(int fd) {
  int bad = 0;
  kvt_manager_config mc = seed_manager_config();
  kvt_manager *m = nullptr;
  if (kvt_manager_create(&m, &mc) != KVT_OK) return 10;
  kvt_connector_config cc = connector_config(KVT_ROLE_WORKER);
  kvt_connector *w = nullptr;
  if (kvt_connector_create(&w, m, &cc) != KVT_OK) {
    kvt_manager_destroy(m);
    return 11;
  }
  {
    EngineG1 g1;
    if (kvt_connector_register_kv_caches(w, &g1.layout, kGpuBlocks) != KVT_OK) bad = 12;
    for (;;) {
      char kind = 0;
      std::string in_bytes;
      if (!recv_frame(fd, &kind, &in_bytes)) {
        bad = bad ? bad : 13;  // the parent went away without 'Q'
        break;
      }
      if (kind == 'Q') break;
      In in{in_bytes};
      Out out;
      if (kind == 'S') {
        Forward check = in.pairs(), fwd = in.pairs();
        std::string meta = in.str();
        uint32_t held = 0;
        kvt_status s = worker_step(w, g1, meta, fwd, [&] {
          for (auto [b, h] : check) held += g1.holds(b, h);
        });
        if (!in.ok) s = KVT_ERR_INTERNAL;
        if (s != KVT_OK || held != check.size()) bad = bad ? bad : 14;
        out.u32(uint32_t(s));
        out.u32(held);
        if (!send_frame(fd, 'A', out.s)) break;
      } else if (kind == 'P') {
        Finished f;
        std::string report;
        kvt_status s = collect(w, &f, &report);
        if (s != KVT_OK) bad = bad ? bad : 15;
        out.u32(uint32_t(s));
        out.str(report);
        for (auto *v : {&f.sending, &f.recving}) {
          out.u32(uint32_t(v->size()));
          for (const auto &id : *v) out.str(id);
        }
        out.u32(uint32_t(f.load_errors.size()));
        for (uint32_t e : f.load_errors) out.u32(e);
        if (!send_frame(fd, 'F', out.s)) break;
      } else if (kind == 'C') {
        kvt_status s = kvt_connector_clear_connector_metadata(w);
        if (s != KVT_OK) bad = bad ? bad : 16;
        out.u32(uint32_t(s));
        if (!send_frame(fd, 'A', out.s)) break;
      } else {
        bad = bad ? bad : 17;
        break;
      }
    }
    kvt_connector_destroy(w);
  }
  if (kvt_manager_check(m) != KVT_OK) bad = bad ? bad : 18;
  kvt_manager_destroy(m);
  return bad;
}

// The parent's end: the worker process behind a socket.
struct RemoteWorker {
  int fd = -1;
  pid_t pid = -1;
  RemoteWorker() {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return;
    pid = fork();
    if (pid == 0) {
      ::close(sv[0]);
      int status = worker_process(sv[1]);
      ::close(sv[1]);
      _exit(status);
    }
    ::close(sv[1]);
    fd = sv[0];
  }
  // Ends the worker ('Q' when asked to) and returns its exit status, -1 when it did not exit.
  int wait(bool quit) {
    if (fd >= 0) {
      if (quit) send_frame(fd, 'Q', "");
      ::close(fd);
      fd = -1;
    }
    if (pid <= 0) return -1;
    int status = 0;
    pid_t got = waitpid(pid, &status, 0);
    pid = -1;
    return got > 0 && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  ~RemoteWorker() { wait(false); }

  // One engine step in the worker; returns how many checked blocks held their KV (-1 when a
  // call failed there). Then the worker's reports go to the scheduler s until done().
  int step(kvt_connector *s, const std::string &meta, const Forward &check, const Forward &fwd,
           const std::function<bool()> &done, Finished *acc) {
    Out o;
    o.pairs(check);
    o.pairs(fwd);
    o.str(meta);
    char kind = 0;
    std::string reply;
    if (!send_frame(fd, 'S', o.s) || !recv_frame(fd, &kind, &reply) || kind != 'A') return -1;
    In a{reply};
    kvt_status st = kvt_status(a.u32());
    int held = int(a.u32());
    EXPECT_EQ(st, KVT_OK) << "the worker's step failed: " << kvt_status_str(st);
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    bool reached = false;
    while (!reached && std::chrono::steady_clock::now() < deadline) {
      if (!send_frame(fd, 'P', "") || !recv_frame(fd, &kind, &reply) || kind != 'F') return -1;
      In f{reply};
      EXPECT_EQ(kvt_status(f.u32()), KVT_OK) << "the worker's get_finished failed";
      std::string report = f.str();
      for (auto *v : {&acc->sending, &acc->recving})
        for (uint32_t n = f.u32(); n > 0 && f.ok; --n) v->push_back(f.str());
      for (uint32_t n = f.u32(); n > 0 && f.ok; --n) acc->load_errors.push_back(f.u32());
      EXPECT_TRUE(f.ok) << "a short frame from the worker";
      EXPECT_KVT(kvt_connector_update_connector_output(s, report.data(), report.size()), KVT_OK);
      reached = done();
      if (!reached) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    EXPECT_TRUE(reached) << "the worker's copies were not reported within 60 s";
    if (!send_frame(fd, 'C', "") || !recv_frame(fd, &kind, &reply) || kind != 'A') return -1;
    In c{reply};
    EXPECT_EQ(kvt_status(c.u32()), KVT_OK) << "the worker's clear_connector_metadata failed";
    return st == KVT_OK ? held : -1;
  }
};

}  // namespace

// The scheduler half here, the worker half in a child process (its own manager with the same
// page_size and G2; the scheduler's manager holds no KV bytes: chunk_bytes 0). Metadata and
// reports cross a socket as bytes. At the end a third request loads B's three blocks back
// from the worker's G2, which proves what the worker's G2 holds.
TEST(ConnectorSeed003, TwoProcesses) {
  RemoteWorker w;  // forked before this process starts any thread
  ASSERT_GE(w.fd, 0) << "socketpair or fork failed";
  kvt_manager_config mc = seed_manager_config();
  mc.chunk_bytes = 0;
  Rig r(connector_config(KVT_ROLE_SCHEDULER), mc);
  ASSERT_NE(r.c, nullptr);
  auto a = seed_a(), b = seed_b(), c = concat(seed_b(), {3000});
  auto ha = hashes_of(a), hb = hashes_of(b);
  Finished f;

  EXPECT_EQ(r.match("A", a), std::make_pair(uint64_t{0}, int32_t{0}));
  ASSERT_KVT_OK(r.alloc("A", {1, 2, 3}, 0));
  EXPECT_EQ(w.step(r.c, r.meta({{"A", 0, 40}}), {}, {{1, ha[0]}, {2, ha[1]}}, r.counts(2, 0), &f),
            0);
  EXPECT_EQ(r.finish("A"), 0);

  EXPECT_EQ(r.match("B", b), std::make_pair(uint64_t{32}, int32_t{0}));
  ASSERT_KVT_OK(r.alloc("B", {4, 5, 6, 7}, 32));
  EXPECT_EQ(w.step(r.c, r.meta({{"B", 32, 20}}), {{4, ha[0]}, {5, ha[1]}}, {{6, hb[2]}},
                   r.counts(3, 2), &f),
            2)
      << "B's blocks do not hold A's bytes in the worker";
  EXPECT_FALSE(f.received("B")) << "a synchronous load was listed in finished_recving";
  EXPECT_EQ(w.step(r.c, r.meta({{"B", 52, 1, {}, {3000}}}), {}, {}, r.counts(3, 2), &f), 0);
  EXPECT_EQ(r.finish("B"), 0);
  EXPECT_EQ(history(r.c, "A"), names({I, PF, FG, FD}));
  EXPECT_EQ(history(r.c, "B"), names({I, OS, OB, PF, DC, FG, FD}));
  EXPECT_EQ(stats(r.m.get(), KVT_TIER_G2).registered, 3u);
  EXPECT_EQ(r.held(hb), 3u);

  // C = B's tokens and its sampled one: B's three blocks come back from the worker's G2.
  EXPECT_EQ(r.match("C", c).first, 48u);
  ASSERT_KVT_OK(r.alloc("C", {20, 21, 22, 23}, 48));
  EXPECT_EQ(w.step(r.c, r.meta({{"C", 48, 5}}), {{20, hb[0]}, {21, hb[1]}, {22, hb[2]}}, {},
                   r.counts(3, 5), &f),
            3)
      << "the worker's G2 does not hold B's bytes";
  EXPECT_EQ(r.finish("C"), 0);
  EXPECT_EQ(g2_active(r.m.get()), 0u);
  EXPECT_KVT(kvt_manager_check(r.m.get()), KVT_OK);
  EXPECT_EQ(w.wait(true), 0) << "the worker process failed (see worker_process for the code)";
}

// --- G3 ---

// Stores go to G3. One of A's blocks is corrupted on disk: B's load reports that G1 block in
// load_error_block_ids, the good block holds A's bytes, B's store of that step fails (it was
// computed over the missing bytes), and the next match stops before the bad block. B then
// recomputes from the bad block on, and its blocks are stored again.
TEST(ConnectorSeed003, G3ChecksumFailureIsReportedAndRecomputed) {
  TempDir dir;
  Rig r(connector_config(KVT_ROLE_BOTH, KVT_OFFLOAD_EAGER, KVT_TIER_G3),
        seed_manager_config(0, 50, dir.path.c_str()));
  ASSERT_NE(r.c, nullptr);
  auto b = seed_b();
  auto ha = hashes_of(seed_a()), hb = hashes_of(b);
  r.run_a();
  ASSERT_EQ(r.held(ha, KVT_TIER_G3), 2u);
  ASSERT_GE(corrupt_g3_block(dir.path, ha[1], 50), 0) << "no G3 slot holds A's second block";

  EXPECT_EQ(r.match("B", b).first, 32u);
  ASSERT_KVT_OK(r.alloc("B", {4, 5, 6, 7}, 32));
  bool good = false;
  Finished f = r.step(
      r.meta({{"B", 32, 20}}), {{6, hb[2]}},
      [&] { return r.stats().load_errors == 1 && r.stats().store_failures == 1; },
      [&] { good = r.g1.holds(4, ha[0]); });
  EXPECT_TRUE(good) << "the good block does not hold A's bytes";
  EXPECT_EQ(f.load_errors, std::vector<uint32_t>{5});
  kvt_connector_stats s = r.stats();
  EXPECT_EQ(s.load_errors, 1u);
  EXPECT_EQ(s.loaded_blocks, 1u);
  EXPECT_EQ(s.stored_blocks, 2u) << "a block computed over a failed load was stored";
  kvt_transfer_stats in = xfer_stats(r.m.get(), KVT_TIER_G3, KVT_TIER_G1);
  EXPECT_EQ(in.failed, 1u);
  EXPECT_EQ(in.blocks, 1u);  // the good block of the failed batch
  EXPECT_EQ(xfer_stats(r.m.get(), KVT_TIER_G1, KVT_TIER_G3).cancelled, 1u)
      << "the store over the failed load is not counted as cancelled";
  EXPECT_EQ(r.held(ha, KVT_TIER_G3), 1u) << "the corrupt block is still registered";
  EXPECT_EQ(r.match("B2", b).first, 16u) << "the next match still reports the corrupt block";
  EXPECT_EQ(r.finish("B2"), 0);

  // The engine recomputes B from the failed block on: both blocks are stored.
  r.step(r.meta({{"B", 16, 36}}), {{5, ha[1]}, {6, hb[2]}}, r.counts(4, 1));
  EXPECT_EQ(r.held(hb, KVT_TIER_G3), 3u);
  EXPECT_EQ(r.finish("B"), 0);
  EXPECT_EQ(r.match("B3", b).first, 48u);
  EXPECT_EQ(r.finish("B3"), 0);
  EXPECT_EQ(stats(r.m.get(), KVT_TIER_G3).active, 0u);
  EXPECT_KVT(kvt_manager_check(r.m.get()), KVT_OK);
}

// As vLLM runs it: the report with B's failed load reaches the scheduler before the worker
// has even started the step's stores, and the recompute is planned before the report of
// their cancellation. The recomputed block is still stored.
TEST(ConnectorSeed003, RecomputeAfterAFailedLoadIsStoredBeforeTheCancellationIsReported) {
  TempDir dir;
  kvt_manager_config mc = seed_manager_config(0, 50, dir.path.c_str());
  mc.g3_fault_op = KVT_G3_FAULT_READ;
  mc.g3_fault_errno = EIO;
  mc.g3_fault_count = 1;
  Rig r(connector_config(KVT_ROLE_BOTH, KVT_OFFLOAD_EAGER, KVT_TIER_G3), mc);
  ASSERT_NE(r.c, nullptr);
  auto b = seed_b();
  auto ha = hashes_of(seed_a()), hb = hashes_of(b);
  r.run_a();
  EXPECT_EQ(r.match("B", b).first, 32u);
  ASSERT_KVT_OK(r.alloc("B", {4, 5, 6, 7}, 32));
  Finished f;
  std::string report;
  ASSERT_KVT_OK(worker_step(r.c, r.g1, r.meta({{"B", 32, 20}}), {{6, hb[2]}}, [&] {
    EXPECT_KVT(collect(r.c, &f, &report), KVT_OK);
    EXPECT_KVT(report_to(r, report), KVT_OK);
  }));
  ASSERT_EQ(f.load_errors, std::vector<uint32_t>{4});
  EXPECT_KVT(kvt_connector_clear_connector_metadata(r.c), KVT_OK);

  // The engine recomputes all of B; the step's stores (block 6's cancelled one still
  // unreported) go out after it. The G3 copy whose read failed left the registry, so the
  // recompute stores it again: A's 2 blocks, then ha[0] and hb[2].
  std::string recompute = r.meta({{"B", 0, 52}});
  r.step(recompute, {{4, ha[0]}, {5, ha[1]}, {6, hb[2]}}, [&] {
    kvt_connector_stats s = r.stats();
    return s.stored_blocks == 4 && s.store_failures == 1;
  });
  EXPECT_EQ(r.held(hb, KVT_TIER_G3), 3u) << "the recomputed block was never stored";
  EXPECT_EQ(r.finish("B"), 0);
  EXPECT_KVT(kvt_manager_check(r.m.get()), KVT_OK);
}

// --- threads ---

// The engine's two threads, as in vLLM: the scheduler thread builds each step's metadata and
// feeds the worker's reports back; the worker thread binds, loads, computes, saves and polls
// get_finished; a third thread reads the scheduler's state meanwhile. Eight pairs of
// requests go through: each A computes two blocks that are stored, each B loads them back.
TEST(Threads, ConnectorHalvesOnTwoThreads) {
  Rig r;
  ASSERT_NE(r.c, nullptr);
  struct Step {
    std::string meta;
    Forward fwd, check;
  };
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Step> steps;
  std::deque<std::string> reports;
  bool done = false;
  std::atomic<int> bad_calls{0}, bad_bytes{0};

  std::thread worker([&] {
    for (;;) {
      Step s;
      {
        std::unique_lock lk(mu);
        cv.wait_for(lk, std::chrono::milliseconds(1), [&] { return done || !steps.empty(); });
        if (done && steps.empty()) return;
        if (!steps.empty()) {
          s = std::move(steps.front());
          steps.pop_front();
        }
      }
      bool stepping = !s.meta.empty();
      if (stepping &&
          worker_step(r.c, r.g1, s.meta, s.fwd, [&] {
            for (auto [b, h] : s.check) bad_bytes += !r.g1.holds(b, h);
          }) != KVT_OK)
        ++bad_calls;
      Finished f;
      std::string report;
      if (collect(r.c, &f, &report) != KVT_OK) ++bad_calls;
      if (stepping && kvt_connector_clear_connector_metadata(r.c) != KVT_OK) ++bad_calls;
      std::lock_guard lk(mu);
      reports.push_back(std::move(report));
    }
  });
  std::atomic<bool> stop{false};
  std::thread reader([&] {
    while (!stop) {
      kvt_connector_stats s{};
      s.struct_size = sizeof s;
      uint32_t st;
      kvt_event ev[8];
      if (kvt_connector_stats_get(&s, r.c) != KVT_OK) ++bad_calls;
      kvt_connector_slot_state(&st, nullptr, nullptr, 0, r.c, "B3");
      kvt_connector_drain_events(r.c, ev, 8);
      std::this_thread::sleep_for(std::chrono::microseconds(50));  // valgrind runs one thread at a time
    }
  });
  // Joins both threads on every way out, a failed ASSERT included (a joinable std::thread
  // at scope exit would abort the whole test program).
  struct Joiner {
    std::function<void()> fn;
    ~Joiner() { fn(); }
  } joiner{[&] {
    {
      std::lock_guard lk(mu);
      done = true;
      steps.clear();
    }
    cv.notify_one();
    if (worker.joinable()) worker.join();
    stop = true;
    if (reader.joinable()) reader.join();
  }};

  // The scheduler thread: one step, then the worker's reports until the counters say so.
  auto run = [&](const std::string &meta, Forward fwd, Forward check, uint64_t stored,
                 uint64_t loaded) {
    {
      std::lock_guard lk(mu);
      steps.push_back({meta, std::move(fwd), std::move(check)});
    }
    cv.notify_one();
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    for (;;) {
      std::deque<std::string> got;
      {
        std::lock_guard lk(mu);
        got.swap(reports);
      }
      for (const auto &rep : got) EXPECT_KVT(report_to(r, rep), KVT_OK);
      kvt_connector_stats s = r.stats();
      if (s.stored_blocks == stored && s.loaded_blocks == loaded) return true;
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  };
  for (uint32_t i = 0; i < 8; ++i) {
    std::string a = "A" + std::to_string(i), b = "B" + std::to_string(i);
    auto ta = token_range(100000 * (i + 1), 40);
    auto tb = concat(std::vector<uint32_t>(ta.begin(), ta.begin() + 32), token_range(7, 20));
    auto ha = hashes_of(ta), hb = hashes_of(tb);
    uint32_t base = 10 * i;
    ASSERT_EQ(r.match(a, ta).first, 0u);
    ASSERT_KVT_OK(r.alloc(a, {base, base + 1, base + 2}, 0));
    ASSERT_TRUE(run(r.meta({{a, 0, 40}}), {{base, ha[0]}, {base + 1, ha[1]}}, {}, 3 * i + 2, 2 * i))
        << a;
    EXPECT_EQ(r.finish(a), 0);
    ASSERT_EQ(r.match(b, tb).first, 32u);
    ASSERT_KVT_OK(r.alloc(b, {base + 3, base + 4, base + 5, base + 6}, 32));
    ASSERT_TRUE(run(r.meta({{b, 32, 20}}), {{base + 5, hb[2]}},
                    {{base + 3, ha[0]}, {base + 4, ha[1]}}, 3 * i + 3, 2 * i + 2))
        << b;
    EXPECT_EQ(r.finish(b), 0);
    EXPECT_EQ(r.g2_holding(hb), 3u) << b;
  }
  joiner.fn();
  EXPECT_EQ(bad_calls.load(), 0);
  EXPECT_EQ(bad_bytes.load(), 0) << "blocks loaded with the wrong bytes";
  EXPECT_EQ(stats(r.m.get(), KVT_TIER_G2).active, 0u);
  EXPECT_KVT(kvt_manager_check(r.m.get()), KVT_OK);
}

// Issue 24, finding 3: two threads in get_finished at once, while the worker's copies end
// (the header lets any thread call a connector). Its outputs were assigned outside the
// worker's lock: ASan saw a double free, TSan a race. Now the calls take turns and each
// succeeds. (What one returns is valid until the next call, from any thread: the callers
// read nothing here.)
TEST(Threads, GetFinishedFromTwoThreadsAtOnce) {
  Rig r;
  ASSERT_NE(r.c, nullptr);
  auto a = seed_a();
  auto ha = hashes_of(a);
  EXPECT_EQ(r.match("A", a).first, 0u);
  ASSERT_KVT_OK(r.alloc("A", {1, 2, 3}, 0));
  ASSERT_KVT_OK(worker_step(r.c, r.g1, r.meta({{"A", 0, 40}}), {{1, ha[0]}, {2, ha[1]}}));
  std::atomic<int> bad{0};
  auto poll = [&] {
    for (int i = 0; i < 2000; ++i) {
      kvt_finished f{};
      f.struct_size = sizeof f;
      if (kvt_connector_get_finished(&f, r.c) != KVT_OK) ++bad;
    }
  };
  std::thread t1(poll), t2(poll);
  t1.join();
  t2.join();
  EXPECT_EQ(bad.load(), 0) << kvt_last_error();
  ASSERT_KVT_OK(kvt_connector_clear_connector_metadata(r.c));
  // What the two threads took is theirs; the store's report came to one of them, so the
  // scheduler never registers it: A finishes with its stores still unreported.
  EXPECT_EQ(r.finish("A"), 1);
}
