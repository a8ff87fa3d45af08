// Helpers of the G4 tests (test_g4.cpp, test_g4_cluster.cpp): blocks filled with their
// hash's pattern, offloads to and onboards from G4 through the C ABI, a child process that
// offloads, G4's counters.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "redis_server.hpp"
#include "test_xfer_support.hpp"

namespace kvt_g4_test {

using namespace kvt_xfer_test;
using kvt_test::RedisServer;

// The bytes every block of hash h holds, wherever it lives.
inline unsigned char pattern(uint64_t h, size_t j) {
  return static_cast<unsigned char>((h * 0x9e3779b97f4a7c15ULL >> 56) ^ (j * 131 + (j >> 8)));
}

inline std::vector<uint64_t> chain(uint64_t base, size_t n) {
  std::vector<uint64_t> h(n);
  for (size_t i = 0; i < n; ++i) h[i] = base * 1000003 + i + 1;
  return h;
}

// 4 KiB blocks, batches due at once, G4 at url (borrowed: it must outlive create).
inline kvt_manager_config g4_config(const std::string &url, const TempDir &dir, uint64_t g1,
                                    uint64_t g2, uint64_t g3 = 0) {
  kvt_manager_config c = xfer_config(dir, g1, g2, g3);
  c.g4_url = url.c_str();
  return c;
}

// New blocks of tier t filled with the pattern of their hashes, registered as one chain.
inline std::vector<kvt_block> filled_in(kvt_manager *m, const std::vector<uint64_t> &h,
                                        kvt_tier t = KVT_TIER_G1) {
  std::vector<kvt_block> b = alloc(m, h.size(), t);
  for (size_t i = 0; i < b.size(); ++i) {
    void *p = nullptr;
    size_t len = 0;
    EXPECT_EQ(kvt_block_data(&p, &len, m, b[i]), KVT_OK) << kvt_last_error();
    for (size_t j = 0; j < len; ++j) static_cast<unsigned char *>(p)[j] = pattern(h[i], j);
  }
  std::vector<kvt_block> out(b.size());
  EXPECT_EQ(kvt_block_register_hashes(out.data(), m, b.data(), h.data(), b.size(), 0), KVT_OK)
      << kvt_last_error();
  return out;
}

// Blocks whose bytes differ from their hash's pattern.
inline size_t mismatches(kvt_manager *m, const std::vector<kvt_block> &b,
                         const std::vector<uint64_t> &h) {
  size_t bad = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    void *p = nullptr;
    size_t len = 0;
    EXPECT_EQ(kvt_block_data(&p, &len, m, b[i]), KVT_OK) << kvt_last_error();
    const auto *c = static_cast<const unsigned char *>(p);
    for (size_t j = 0; j < len; ++j)
      if (c[j] != pattern(h[i], j)) {
        ++bad;
        break;
      }
  }
  return bad;
}

// A transfer's end: its status, count and how many XFER_DONE events named it (events of
// other transfers polled meanwhile are dropped).
struct Ended {
  kvt_status status;
  uint64_t count = 0;
  int events = 0;
  uint32_t event_tier = 0;
};
inline Ended wait_end(kvt_manager *m, kvt_xfer *x) {
  Ended e{finish(x)};
  EXPECT_EQ(kvt_xfer_status(nullptr, nullptr, &e.count, x), KVT_OK);
  for (const kvt_event &ev : drain(m)) {
    EXPECT_FALSE(ev.type == KVT_EVENT_BLOCK_STORED && ev.tier == KVT_TIER_G4)
        << "G4 emits no BLOCK_STORED";
    if (ev.type != KVT_EVENT_XFER_DONE || ev.xfer != x) continue;
    ++e.events;
    e.event_tier = ev.tier;
    EXPECT_EQ(ev.status, e.status);
    EXPECT_EQ(ev.count, e.count);
  }
  return e;
}

inline Ended offload(kvt_manager *m, const std::vector<kvt_block> &src, kvt_tier dst) {
  kvt_xfer *x = nullptr;
  EXPECT_EQ(kvt_xfer_offload(&x, m, src.data(), src.size(), dst, nullptr, 7), KVT_OK)
      << kvt_last_error();
  if (x == nullptr) return {KVT_ERR_INTERNAL};
  Ended e = wait_end(m, x);
  kvt_xfer_release(x);
  return e;
}

inline size_t g4_matched(kvt_manager *m, const std::vector<uint64_t> &h) {
  size_t n = 99999;
  EXPECT_EQ(kvt_g4_match(&n, m, h.data(), h.size()), KVT_OK) << kvt_last_error();
  return n;
}

inline kvt_g4_stats g4_stats(kvt_manager *m) {
  kvt_g4_stats s{};
  s.struct_size = sizeof s;
  EXPECT_EQ(kvt_g4_stats_get(&s, m), KVT_OK) << kvt_last_error();
  return s;
}

// Onboards h (a chain from parent 0) from G4 into new blocks of tier t. On KVT_OK, *out
// gets the final handles (the caller's); else the caller's own blocks, as the transfer
// left them.
inline Ended g4_onboard(kvt_manager *m, const std::vector<uint64_t> &h, kvt_tier t,
                        std::vector<kvt_block> *out) {
  std::vector<kvt_block> dst = alloc(m, h.size(), t);
  kvt_xfer *x = nullptr;
  EXPECT_EQ(kvt_g4_onboard(&x, m, h.data(), h.size(), 0, dst.data(), nullptr, 9), KVT_OK)
      << kvt_last_error();
  if (x == nullptr) return {KVT_ERR_INTERNAL};
  Ended e = wait_end(m, x);
  *out = dst;
  if (e.status == KVT_OK) {
    EXPECT_EQ(kvt_xfer_blocks(out->data(), out->size(), x), KVT_OK);
  }
  kvt_xfer_release(x);
  return e;
}

inline void release(kvt_manager *m, const std::vector<kvt_block> &b) {
  EXPECT_EQ(kvt_block_release(m, b.data(), b.size()), KVT_OK) << kvt_last_error();
}

// The child process's part: offload the prefix to G4 and exit 0, or say what failed.
inline int offload_in_child(const std::string &url, const std::vector<uint64_t> &h) {
  TempDir dir;
  kvt_manager_config c = g4_config(url, dir, 32, 0);
  kvt_manager *m = nullptr;
  if (kvt_manager_create(&m, &c) != KVT_OK) return 2;
  std::vector<kvt_block> b(h.size()), reg(h.size());
  int rc = 0;
  if (kvt_block_alloc(b.data(), b.size(), m, KVT_TIER_G1) != KVT_OK) rc = 3;
  for (size_t i = 0; rc == 0 && i < b.size(); ++i) {
    void *p = nullptr;
    size_t len = 0;
    if (kvt_block_data(&p, &len, m, b[i]) != KVT_OK) rc = 4;
    for (size_t j = 0; rc == 0 && j < len; ++j)
      static_cast<unsigned char *>(p)[j] = pattern(h[i], j);
  }
  if (rc == 0 && kvt_block_register_hashes(reg.data(), m, b.data(), h.data(), h.size(), 0))
    rc = 5;
  kvt_xfer *x = nullptr;
  if (rc == 0 && kvt_xfer_offload(&x, m, reg.data(), reg.size(), KVT_TIER_G4, nullptr, 0)) rc = 6;
  uint64_t count = 0;
  if (rc == 0 && kvt_xfer_wait(x, int64_t{30} * 1000 * 1000 * 1000) != KVT_OK) rc = 7;
  if (rc == 0 && (kvt_xfer_status(nullptr, nullptr, &count, x) || count != h.size())) rc = 8;
  kvt_xfer_release(x);
  if (rc == 0 && kvt_manager_check(m) != KVT_OK) rc = 9;
  kvt_manager_destroy(m);
  return rc;
}

// Another process offloads h (offload_in_child) and exits; whether it succeeded.
inline ::testing::AssertionResult offloaded_by_another_process(const std::string &url,
                                                               const std::vector<uint64_t> &h) {
  pid_t pid = fork();
  if (pid < 0) return ::testing::AssertionFailure() << "fork failed";
  if (pid == 0) _exit(offload_in_child(url, h));
  int st = 0;
  if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st))
    return ::testing::AssertionFailure() << "the offloading process did not exit";
  if (WEXITSTATUS(st) != 0)
    return ::testing::AssertionFailure()
           << "the offloading process failed at step " << WEXITSTATUS(st);
  return ::testing::AssertionSuccess();
}

// m finds all of h in G4, and onboards it into G1 byte for byte.
inline void expect_served_whole(kvt_manager *m, const std::vector<uint64_t> &h) {
  EXPECT_EQ(g4_matched(m, h), h.size());
  std::vector<kvt_block> got;
  Ended e = g4_onboard(m, h, KVT_TIER_G1, &got);
  ASSERT_EQ(e.status, KVT_OK) << kvt_last_error();
  EXPECT_EQ(mismatches(m, got, h), 0u);
  release(m, got);
}

}  // namespace kvt_g4_test
