// Shared test helpers: managers with RAII, status assertions that print kvt_last_error(),
// and snapshots that prove a failed call changed nothing.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "kvtier.h"

#if __has_include(<valgrind/valgrind.h>)
#include <valgrind/valgrind.h>
#else
#define RUNNING_ON_VALGRIND 0
#endif

#define EXPECT_KVT(expr, want)                                                           \
  do {                                                                                   \
    kvt_status s_ = (expr);                                                              \
    EXPECT_EQ(s_, (want)) << #expr << " -> " << kvt_status_str(s_) << ": "               \
                          << kvt_last_error();                                           \
  } while (0)
#define ASSERT_KVT_OK(expr)                                                              \
  do {                                                                                   \
    kvt_status s_ = (expr);                                                              \
    ASSERT_EQ(s_, KVT_OK) << #expr << " -> " << kvt_status_str(s_) << ": "               \
                          << kvt_last_error();                                           \
  } while (0)

namespace kvt_test {

// Length of the prefix of h that tier t holds; the matched blocks go to *out (pinned, the
// caller's) or are released at once.
inline size_t matched(kvt_manager *m, kvt_tier t, const std::vector<uint64_t> &h,
                      std::vector<kvt_block> *out = nullptr) {
  std::vector<kvt_block> b(h.size());
  size_t n = 0;
  EXPECT_EQ(kvt_tier_match_prefix(&n, b.data(), m, t, h.data(), h.size()), KVT_OK);
  b.resize(n);
  if (out) *out = b;
  else kvt_block_release(m, b.data(), n);
  return n;
}

// A directory of the test's own under base (G3 files go there), removed afterwards.
struct TempDir {
  std::string path;
  explicit TempDir(const char *base = "/tmp") {
    std::string t = std::string(base) + "/kvtier-test-XXXXXX";
    path = mkdtemp(t.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir &) = delete;
  TempDir &operator=(const TempDir &) = delete;
  // The G3 file: the largest regular file in the directory, "" if there is none.
  std::string g3_file() const {
    std::string best;
    uintmax_t size = 0;
    for (auto &e : std::filesystem::directory_iterator(path))
      if (e.is_regular_file() && e.file_size() >= size) {
        size = e.file_size();
        best = e.path();
      }
    return best;
  }
  // Names in dir that start with prefix, sorted.
  static std::vector<std::string> names_of(const std::string &dir, const std::string &prefix = "") {
    std::vector<std::string> v;
    for (auto &e : std::filesystem::directory_iterator(dir))
      if (e.path().filename().string().rfind(prefix, 0) == 0)
        v.push_back(e.path().filename().string());
    std::sort(v.begin(), v.end());
    return v;
  }
  std::vector<std::string> names() const { return names_of(path); }
};

struct ManagerDeleter {
  void operator()(kvt_manager *m) const { kvt_manager_destroy(m); }
};
using ManagerPtr = std::unique_ptr<kvt_manager, ManagerDeleter>;

// The g3_io a test asks for, except that KVTIER_TEST_G3_IO=threads turns AUTO into THREADS:
// valgrind does not see io_uring's writes into user buffers. The test programs read this
// variable; the library reads none.
inline uint32_t test_g3_io(uint32_t want) {
  const char *io = std::getenv("KVTIER_TEST_G3_IO");
  return want == KVT_IO_AUTO && io != nullptr && std::strcmp(io, "threads") == 0
             ? uint32_t(KVT_IO_THREADS)
             : want;
}

inline kvt_manager_config small_config(uint64_t g1 = 8, uint64_t g2 = 8, uint64_t g3 = 0) {
  kvt_manager_config c;
  kvt_manager_config_init(&c);
  c.page_size = 4;
  c.num_layers = 2;
  c.num_outer = 2;
  c.chunk_bytes = 64;
  c.g1_blocks = g1;
  c.g2_blocks = g2;
  c.g3_blocks = g3;
  c.g1_memory = KVT_MEMORY_HOST;
  c.g3_io = test_g3_io(c.g3_io);
  return c;
}

inline ManagerPtr make(const kvt_manager_config &c) {
  kvt_manager *m = nullptr;
  kvt_status s = kvt_manager_create(&m, &c);
  EXPECT_EQ(s, KVT_OK) << kvt_last_error();
  return ManagerPtr(m);
}

inline kvt_tier_stats stats(kvt_manager *m, kvt_tier t) {
  kvt_tier_stats s{};
  s.struct_size = sizeof s;
  EXPECT_EQ(kvt_tier_stats_get(&s, m, t), KVT_OK) << kvt_last_error();
  return s;
}

inline kvt_transfer_stats xfer_stats(kvt_manager *m, kvt_tier src, kvt_tier dst) {
  kvt_transfer_stats s{};
  s.struct_size = sizeof s;
  EXPECT_EQ(kvt_transfer_stats_get(&s, m, src, dst), KVT_OK) << kvt_last_error();
  return s;
}

inline kvt_block_info info(kvt_manager *m, kvt_block b) {
  kvt_block_info i{};
  i.struct_size = sizeof i;
  EXPECT_EQ(kvt_block_info_get(&i, m, b), KVT_OK) << kvt_last_error();
  return i;
}

inline uint32_t state_of(kvt_manager *m, kvt_block b) { return info(m, b).state; }

inline std::vector<kvt_block> alloc(kvt_manager *m, size_t n, kvt_tier t = KVT_TIER_G1) {
  std::vector<kvt_block> v(n);
  EXPECT_EQ(kvt_block_alloc(v.data(), n, m, t), KVT_OK) << kvt_last_error();
  return v;
}

// Allocates and registers blocks under the given hashes, chaining parents; returns the
// registered handles (each holding one reference).
inline std::vector<kvt_block> store(kvt_manager *m, const std::vector<uint64_t> &hashes,
                                    kvt_tier t = KVT_TIER_G1) {
  std::vector<kvt_block> out;
  auto blocks = alloc(m, hashes.size(), t);
  uint64_t parent = 0;
  for (size_t i = 0; i < hashes.size(); ++i) {
    kvt_block r = 0;
    EXPECT_EQ(kvt_block_register_hash(&r, m, blocks[i], hashes[i], parent), KVT_OK)
        << kvt_last_error();
    out.push_back(r);
    parent = hashes[i];
  }
  return out;
}

inline std::vector<kvt_event> drain(kvt_manager *m) {
  std::vector<kvt_event> all;
  kvt_event buf[64];
  for (size_t n; (n = kvt_manager_poll(m, buf, 64)) > 0;) all.insert(all.end(), buf, buf + n);
  return all;
}

// Everything observable about the tiers' occupancy, to prove a failing call changed nothing.
struct Snapshot {
  std::vector<uint64_t> v;
  explicit Snapshot(kvt_manager *m) {
    for (kvt_tier t : {KVT_TIER_G1, KVT_TIER_G2, KVT_TIER_G3}) {
      kvt_tier_stats s = stats(m, t);
      v.insert(v.end(), {s.free, s.active, s.inactive, s.registered, s.allocs, s.evictions,
                         s.registrations, s.dedups});
    }
  }
  bool operator==(const Snapshot &o) const { return v == o.v; }
};

// A file's bytes ("" if it cannot be read), and a file written with exactly these bytes.
inline std::string slurp(const std::string &path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

inline void spit(const std::string &path, const std::string &bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

}  // namespace kvt_test
