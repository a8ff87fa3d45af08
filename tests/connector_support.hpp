// Shared helpers of the connector tests: the engine's G1 (a host buffer in seed 003's
// layout), the KV bytes a block's hash implies, seed 003's requests, snapshots of slots, and
// a step runner that plays one engine step on the worker half and hands its reports to the
// scheduler half, and a G3 block corrupted on disk.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "support.hpp"

namespace kvt_conn_test {

using namespace kvt_test;

// Seed 003's shape: 16 tokens per block, 2 layers x K/V x 256 bytes = 1024-byte blocks.
inline constexpr uint32_t kPage = 16, kLayers = 2, kOuter = 2;
inline constexpr uint64_t kChunk = 256, kBlock = kLayers * kOuter * kChunk;
inline constexpr uint64_t kGpuBlocks = 100;

// Byte k of the KV of a full block whose sequence hash is h.
inline uint8_t kv_byte(uint64_t h, size_t k) {
  return uint8_t(((h >> (8 * (k % 8))) & 0xff) ^ ((k / 8) & 0xff));
}

// The engine's G1: block b is bytes [b * kBlock, (b + 1) * kBlock) of one host buffer, chunk
// (l, o) of it at (l * kOuter + o) * kChunk. Zero-filled.
struct EngineG1 {
  std::vector<uint8_t> buf;
  std::vector<const void *> bases;
  std::vector<uint64_t> strides;
  kvt_g1_layout layout{};
  explicit EngineG1(uint64_t blocks = kGpuBlocks) : buf(blocks * kBlock, 0) {
    for (uint32_t i = 0; i < kLayers * kOuter; ++i) {
      bases.push_back(buf.data() + i * kChunk);
      strides.push_back(kBlock);
    }
    layout.struct_size = sizeof layout;
    layout.memory = KVT_MEMORY_HOST;
    layout.bases = bases.data();
    layout.strides = strides.data();
  }
  EngineG1(const EngineG1 &) = delete;
  EngineG1 &operator=(const EngineG1 &) = delete;
  uint8_t *block(uint32_t b) { return buf.data() + b * kBlock; }
  // The model's forward: block b gets the KV of hash h.
  void write(uint32_t b, uint64_t h) {
    for (size_t k = 0; k < kBlock; ++k) block(b)[k] = kv_byte(h, k);
  }
  void fill(uint32_t b, uint8_t v) { std::memset(block(b), v, kBlock); }
  bool holds(uint32_t b, uint64_t h) {
    for (size_t k = 0; k < kBlock; ++k)
      if (block(b)[k] != kv_byte(h, k)) return false;
    return true;
  }
};

// Bytes of one block (G2 data, or a G1 block) hold the KV of hash h.
inline bool kv_equal(const void *p, size_t len, uint64_t h) {
  if (len != kBlock) return false;
  for (size_t k = 0; k < len; ++k)
    if (static_cast<const uint8_t *>(p)[k] != kv_byte(h, k)) return false;
  return true;
}

// Tokens first, first + 1, ..., first + n - 1.
inline std::vector<uint32_t> token_range(uint32_t first, size_t n) {
  std::vector<uint32_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = first + uint32_t(i);
  return v;
}
// Seed 003: A = 1000..1039; B = A's first 32 tokens, then 2000..2019.
inline std::vector<uint32_t> seed_a() { return token_range(1000, 40); }
inline std::vector<uint32_t> seed_b() {
  std::vector<uint32_t> b = token_range(1000, 32), tail = token_range(2000, 20);
  b.insert(b.end(), tail.begin(), tail.end());
  return b;
}
inline std::vector<uint32_t> concat(std::vector<uint32_t> a, const std::vector<uint32_t> &b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Sequence hashes of the full blocks, under the connector's default salt.
inline std::vector<uint64_t> hashes_of(const std::vector<uint32_t> &tokens,
                                       uint32_t page = kPage) {
  uint64_t salt = 0;
  EXPECT_EQ(kvt_hash_salt(&salt, nullptr, 0), KVT_OK);
  std::vector<uint64_t> h(tokens.size() / page + 1);
  size_t n = 0;
  EXPECT_EQ(kvt_hash_tokens(h.data(), h.size(), &n, salt, tokens.data(), tokens.size(), page),
            KVT_OK);
  h.resize(n);
  return h;
}

inline kvt_manager_config seed_manager_config(uint64_t g2 = 50, uint64_t g3 = 0,
                                              const char *g3_path = nullptr) {
  kvt_manager_config c;
  kvt_manager_config_init(&c);
  c.page_size = kPage;
  c.num_layers = kLayers;
  c.num_outer = kOuter;
  c.chunk_bytes = kChunk;
  c.g1_blocks = 1;  // the engine owns G1
  c.g2_blocks = g2;
  c.g3_blocks = g3;
  c.g3_path = g3_path;
  c.g1_memory = KVT_MEMORY_HOST;
  c.g3_io = test_g3_io(c.g3_io);
  return c;
}

inline kvt_connector_config connector_config(uint32_t role = KVT_ROLE_BOTH,
                                             uint32_t offload = KVT_OFFLOAD_EAGER,
                                             uint32_t store_tier = KVT_TIER_G2,
                                             uint32_t load_async = 0) {
  kvt_connector_config c;
  kvt_connector_config_init(&c);
  c.role = role;
  c.offload = offload;
  c.store_tier = store_tier;
  c.num_gpu_blocks = kGpuBlocks;
  c.load_async = load_async;
  return c;
}

// --- slots ---

inline kvt_connector_stats cstats(kvt_connector *c) {
  kvt_connector_stats s{};
  s.struct_size = sizeof s;
  EXPECT_EQ(kvt_connector_stats_get(&s, c), KVT_OK) << kvt_last_error();
  return s;
}

// The slot's state, 0 when the call fails (an unknown id).
inline uint32_t slot_state(kvt_connector *c, const std::string &id) {
  uint32_t st = 0;
  if (kvt_connector_slot_state(&st, nullptr, nullptr, 0, c, id.c_str()) != KVT_OK) return 0;
  return st;
}

// The slot's states so far by name; {"NOT_FOUND"} for an unknown id.
inline std::vector<std::string> history(kvt_connector *c, const std::string &id) {
  size_t n = 0;
  if (kvt_connector_slot_state(nullptr, nullptr, &n, 0, c, id.c_str()) != KVT_OK)
    return {"NOT_FOUND"};
  std::vector<uint32_t> h(n);
  size_t n2 = 0;
  EXPECT_EQ(kvt_connector_slot_state(nullptr, h.data(), &n2, n, c, id.c_str()), KVT_OK);
  EXPECT_EQ(n2, n);
  std::vector<std::string> names;
  for (uint32_t s : h) names.push_back(kvt_slot_state_str(s));
  return names;
}

inline std::vector<std::string> names(std::initializer_list<uint32_t> states) {
  std::vector<std::string> v;
  for (uint32_t s : states) v.push_back(kvt_slot_state_str(s));
  return v;
}

// Everything observable about a set of slots and the scheduler's counters, to prove that a
// failing call changed nothing.
struct SlotSnapshot {
  std::vector<std::vector<std::string>> hist;
  std::vector<uint32_t> state;
  kvt_connector_stats stats{};
  SlotSnapshot(kvt_connector *c, const std::vector<std::string> &ids) {
    for (const auto &id : ids) {
      hist.push_back(history(c, id));
      state.push_back(slot_state(c, id));
    }
    stats = cstats(c);
  }
  bool operator==(const SlotSnapshot &o) const {
    return hist == o.hist && state == o.state &&
           std::memcmp(&stats, &o.stats, sizeof stats) == 0;
  }
  std::string str() const {
    std::string out;
    for (const auto &h : hist) {
      out += "[";
      for (const auto &n : h) out += " " + n;
      out += " ] ";
    }
    return out;
  }
};

// Asserts a call that the connector of rig r refuses: its status, a message of its own, and
// no change to the slots `ids` (a std::vector<std::string>), to the scheduler's counters or
// to the manager's tiers.
#define EXPECT_CONN_REFUSED(r, ids, expr, want)                                            \
  do {                                                                                     \
    ::kvt_conn_test::SlotSnapshot slots_((r).c, ids);                                      \
    ::kvt_test::Snapshot tiers_((r).m.get());                                              \
    kvt_hash_salt(nullptr, nullptr, 0); /* leaves a known message */                      \
    std::string stale_ = kvt_last_error();                                                 \
    EXPECT_KVT(expr, want);                                                                \
    EXPECT_NE(stale_, kvt_last_error()) << #expr " set no message";                        \
    EXPECT_STRNE(kvt_last_error(), "") << #expr;                                           \
    ::kvt_conn_test::SlotSnapshot after_((r).c, ids);                                      \
    EXPECT_TRUE(after_ == slots_) << #expr " changed the slots: " << slots_.str() << "-> " \
                                  << after_.str();                                         \
    EXPECT_TRUE(::kvt_test::Snapshot((r).m.get()) == tiers_) << #expr " changed a tier";   \
  } while (0)

// --- steps ---

// What one request is in a step's schedule (kvt_scheduled_request, with owned arrays).
struct Sched {
  std::string id;
  uint64_t computed = 0, scheduled = 0;
  std::vector<uint32_t> new_blocks = {}, new_tokens = {};
};

// build_connector_meta over reqs; the metadata bytes (copied), or "" with *status set.
inline std::string build_meta(kvt_connector *c, const std::vector<Sched> &reqs,
                              kvt_status *status = nullptr) {
  std::vector<kvt_scheduled_request> r;
  for (const Sched &s : reqs) {
    kvt_scheduled_request x{};
    x.req_id = s.id.c_str();
    x.num_computed_tokens = s.computed;
    x.num_scheduled_tokens = s.scheduled;
    x.new_block_ids = s.new_blocks.data();
    x.num_new_block_ids = s.new_blocks.size();
    x.new_token_ids = s.new_tokens.data();
    x.num_new_token_ids = s.new_tokens.size();
    r.push_back(x);
  }
  const void *meta = nullptr;
  size_t len = 0;
  kvt_status st = kvt_connector_build_connector_meta(&meta, &len, c, r.data(), r.size());
  if (status) *status = st;
  else EXPECT_EQ(st, KVT_OK) << kvt_last_error();
  if (st != KVT_OK) return "";
  EXPECT_TRUE(meta != nullptr || len == 0);
  return std::string(static_cast<const char *>(meta), len);
}

// What the worker listed in its get_finished calls, accumulated.
struct Finished {
  std::vector<std::string> sending, recving;
  std::vector<uint32_t> load_errors;
  std::vector<std::string> reports;  // every report, in order
  static bool has(const std::vector<std::string> &v, const std::string &id) {
    return std::find(v.begin(), v.end(), id) != v.end();
  }
  bool sent(const std::string &id) const { return has(sending, id); }
  bool received(const std::string &id) const { return has(recving, id); }
};

// One get_finished on the worker w, added to *acc; *report gets its report bytes.
inline kvt_status collect(kvt_connector *w, Finished *acc, std::string *report) {
  kvt_finished f{};
  f.struct_size = sizeof f;
  kvt_status s = kvt_connector_get_finished(&f, w);
  if (s != KVT_OK) return s;
  for (size_t i = 0; i < f.num_finished_sending; ++i) acc->sending.push_back(f.finished_sending[i]);
  for (size_t i = 0; i < f.num_finished_recving; ++i) acc->recving.push_back(f.finished_recving[i]);
  acc->load_errors.insert(acc->load_errors.end(), f.load_error_block_ids,
                          f.load_error_block_ids + f.num_load_errors);
  report->assign(static_cast<const char *>(f.report), f.report_len);
  acc->reports.push_back(*report);
  return KVT_OK;
}

// Blocks the model writes in a step: (G1 block id, hash whose KV it computes).
using Forward = std::vector<std::pair<uint32_t, uint64_t>>;

// The worker's side of one engine step, up to wait_for_save: bind, start_load_kv,
// wait_for_layer_load for every layer, after_load (to look at loaded bytes), the forward,
// save_kv_layer for every layer, wait_for_save. Returns the first failure.
inline kvt_status worker_step(kvt_connector *w, EngineG1 &g1, const std::string &meta,
                              const Forward &fwd, const std::function<void()> &after_load = {}) {
  kvt_status s;
  if ((s = kvt_connector_bind_connector_metadata(w, meta.data(), meta.size())) != KVT_OK) return s;
  if ((s = kvt_connector_start_load_kv(w)) != KVT_OK) return s;
  for (uint32_t l = 0; l < kLayers; ++l)
    if ((s = kvt_connector_wait_for_layer_load(w, l)) != KVT_OK) return s;
  if (after_load) after_load();
  for (auto [b, h] : fwd) g1.write(b, h);
  for (uint32_t l = 0; l < kLayers; ++l)
    if ((s = kvt_connector_save_kv_layer(w, l)) != KVT_OK) return s;
  return kvt_connector_wait_for_save(w);
}

// Polls get_finished on the worker w and hands each report to the scheduler s, until done()
// holds or `seconds` pass. Returns done().
inline bool drain(kvt_connector *w, kvt_connector *s, Finished *acc,
                  const std::function<bool()> &done, double seconds = 60) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  for (;;) {
    std::string report;
    kvt_status st = collect(w, acc, &report);
    EXPECT_EQ(st, KVT_OK) << "get_finished: " << kvt_last_error();
    if (st != KVT_OK) return false;
    st = kvt_connector_update_connector_output(s, report.data(), report.size());
    EXPECT_EQ(st, KVT_OK) << "update_connector_output: " << kvt_last_error();
    if (st != KVT_OK) return false;
    if (done()) return true;
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// A manager, a connector over it and the engine's G1 registered with it (for a worker).
struct Rig {
  ManagerPtr m;
  kvt_connector *c = nullptr;
  EngineG1 g1;

  explicit Rig(const kvt_connector_config &cc = connector_config(),
               const kvt_manager_config &mc = seed_manager_config())
      : m(make(mc)) {
    if (!m) return;
    EXPECT_EQ(kvt_connector_create(&c, m.get(), &cc), KVT_OK) << kvt_last_error();
    if (c && cc.role != KVT_ROLE_SCHEDULER) {
      EXPECT_EQ(kvt_connector_register_kv_caches(c, &g1.layout, kGpuBlocks), KVT_OK)
          << kvt_last_error();
    }
  }
  ~Rig() { kvt_connector_destroy(c); }
  Rig(const Rig &) = delete;
  Rig &operator=(const Rig &) = delete;

  kvt_connector_stats stats() { return cstats(c); }

  // get_num_new_matched_tokens, expected to succeed: {tokens, load_async}.
  std::pair<uint64_t, int32_t> match(const std::string &id, const std::vector<uint32_t> &tokens,
                                     uint64_t computed = 0) {
    uint64_t n = ~uint64_t{0};
    int32_t async = -1;
    EXPECT_EQ(kvt_connector_get_num_new_matched_tokens(&n, &async, c, id.c_str(), tokens.data(),
                                                       tokens.size(), computed),
              KVT_OK)
        << kvt_last_error();
    return {n, async};
  }
  kvt_status alloc(const std::string &id, const std::vector<uint32_t> &blocks, uint64_t ext) {
    return kvt_connector_update_state_after_alloc(c, id.c_str(), blocks.data(), blocks.size(),
                                                  ext);
  }
  std::string meta(const std::vector<Sched> &reqs) { return build_meta(c, reqs); }
  // request_finished: its delay_free, or -1 when the call fails.
  int32_t finish(const std::string &id) {
    int32_t delay = -1;
    EXPECT_EQ(kvt_connector_request_finished(&delay, c, id.c_str()), KVT_OK) << kvt_last_error();
    return delay;
  }

  // One engine step over meta (this connector is both halves): the worker's step, then its
  // reports until done() (default: the first report), then clear_connector_metadata.
  // Fails the test when a call fails or done() does not come within 60 s (valgrind on a
  // loaded machine is slow).
  Finished step(const std::string &meta, const Forward &fwd = {},
                const std::function<bool()> &done = {},
                const std::function<void()> &after_load = {}) {
    Finished acc;
    EXPECT_EQ(worker_step(c, g1, meta, fwd, after_load), KVT_OK) << kvt_last_error();
    EXPECT_TRUE(drain(c, c, &acc, done ? done : [] { return true; }))
        << "the step's copies were not reported within 60 s";
    EXPECT_EQ(kvt_connector_clear_connector_metadata(c), KVT_OK) << kvt_last_error();
    return acc;
  }
  // done() for step: the scheduler counts `stored` stores and `loaded` loads.
  std::function<bool()> counts(uint64_t stored, uint64_t loaded) {
    return [this, stored, loaded] {
      kvt_connector_stats s = stats();
      return s.stored_blocks == stored && s.loaded_blocks == loaded;
    };
  }

  // Seed 003's request A, start to end: matched 0, G1 blocks {1, 2, 3}, one step that
  // computes its 40 tokens (blocks 1 and 2 full) and waits for `stores` of them to be
  // stored (2 with eager offload), finished.
  void run_a(uint64_t stores = 2) {
    std::vector<uint32_t> a = seed_a();
    std::vector<uint64_t> h = hashes_of(a);
    kvt_connector_stats before = stats();
    EXPECT_EQ(match("A", a).first, 0u);
    EXPECT_KVT(alloc("A", {1, 2, 3}, 0), KVT_OK);
    step(meta({{"A", 0, 40}}), {{1, h[0]}, {2, h[1]}},
         counts(before.stored_blocks + stores, before.loaded_blocks));
    EXPECT_EQ(finish("A"), 0);
  }

  // G2 (or G3) holds these hashes as a prefix: how many.
  size_t held(const std::vector<uint64_t> &h, kvt_tier t = KVT_TIER_G2) {
    return matched(m.get(), t, h);
  }
  // G2 holds the KV of each of these hashes: how many blocks of the matched prefix do.
  size_t g2_holding(const std::vector<uint64_t> &h) {
    std::vector<kvt_block> b;
    size_t n = matched(m.get(), KVT_TIER_G2, h, &b), good = 0;
    for (size_t i = 0; i < n; ++i) {
      void *p = nullptr;
      size_t len = 0;
      EXPECT_EQ(kvt_block_data(&p, &len, m.get(), b[i]), KVT_OK) << kvt_last_error();
      good += kv_equal(p, len, h[i]);
    }
    kvt_block_release(m.get(), b.data(), b.size());
    return good;
  }
};

// --- G3 ---

// Flips a byte of the data of the G3 slot holding seq_hash, in the G3 file under dir. Slot s
// lies at s * slot_bytes: the data padded to 4 KiB, then a 4 KiB header that begins with a
// magic and the sequence hash (src/copy/disk_engine.hpp). Returns the slot, -1 if none.
inline int64_t corrupt_g3_block(const std::string &dir, uint64_t seq_hash, uint64_t g3_blocks) {
  constexpr uint64_t kPageBytes = 4096, kMagic = 0x544c53334754564bULL;
  auto files = TempDir::names_of(dir, "kvtier-g3-");
  EXPECT_EQ(files.size(), 1u);
  if (files.size() != 1) return -1;
  int fd = ::open((dir + "/" + files[0]).c_str(), O_RDWR);
  EXPECT_GE(fd, 0);
  if (fd < 0) return -1;
  const uint64_t data_bytes = (kBlock + kPageBytes - 1) / kPageBytes * kPageBytes;
  const uint64_t slot_bytes = data_bytes + kPageBytes;
  int64_t found = -1;
  for (uint64_t s = 0; s < g3_blocks && found < 0; ++s) {
    uint64_t head[2] = {0, 0};
    if (pread(fd, head, sizeof head, off_t(s * slot_bytes + data_bytes)) != sizeof head) break;
    if (head[0] != kMagic || head[1] != seq_hash) continue;
    uint8_t byte = 0;
    off_t at = off_t(s * slot_bytes + 100);
    if (pread(fd, &byte, 1, at) == 1) {
      byte ^= 0x5a;
      if (pwrite(fd, &byte, 1, at) == 1 && fsync(fd) == 0) found = int64_t(s);
    }
  }
  ::close(fd);
  return found;
}

}  // namespace kvt_conn_test
