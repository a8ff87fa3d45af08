// Helpers of the G3 tests: directories, a log capture, a G3 round trip that reports what
// went wrong as a string (so that it also runs in a forked child, where gtest cannot
// assert), and child processes that hold a manager until they are killed.
#pragma once

#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <functional>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "support.hpp"

namespace kvt_test {


// Every log message while it lives (process-wide: one at a time).
class LogCapture {
 public:
  LogCapture() { kvt_log_set_callback(KVT_LOG_DEBUG, &LogCapture::take, this); }
  ~LogCapture() { kvt_log_set_callback(KVT_LOG_OFF, nullptr, nullptr); }
  // Messages at `level` that contain `part`.
  std::vector<std::string> find(int level, const std::string &part) {
    std::lock_guard lock(mu_);
    std::vector<std::string> out;
    for (auto &[l, m] : msgs_)
      if (l == level && m.find(part) != std::string::npos) out.push_back(m);
    return out;
  }

 private:
  static void take(int level, const char *message, void *self) {
    auto *c = static_cast<LogCapture *>(self);
    std::lock_guard lock(c->mu_);
    c->msgs_.emplace_back(level, message);
  }
  std::mutex mu_;
  std::vector<std::pair<int, std::string>> msgs_;
};

// 4 KiB blocks, G3 of g3 blocks in dir (NULL: a temporary directory), small batches.
inline kvt_manager_config g3_config(const char *dir, uint64_t g3 = 16) {
  kvt_manager_config c = small_config(8, 0, g3);
  c.chunk_bytes = 1024;  // 2 layers x 2 x 1 KiB
  c.g3_path = dir;
  c.flush_interval_us = 1000;
  c.min_batch_size = 1;
  return c;
}

inline std::string status_text(const char *what, kvt_status s) {
  return std::string(what) + " -> " + kvt_status_str(s) + ": " + kvt_last_error();
}

// Offloads n G1 blocks of random bytes (hashes first..first+n-1) to G3, drops them from
// G1, onboards them back and compares the bytes. Returns "" or what went wrong.
inline std::string g3_roundtrip(kvt_manager *m, uint64_t first, size_t n, uint32_t seed) {
  const int64_t kWait = int64_t(30) * 1000 * 1000 * 1000;
  std::vector<kvt_block> b(n), reg(n), src(n), dst(n), fin(n);
  std::vector<uint64_t> h(n);
  std::vector<std::vector<unsigned char>> want;
  std::mt19937 rng(seed);
  if (kvt_status s = kvt_block_alloc(b.data(), n, m, KVT_TIER_G1); s != KVT_OK)
    return status_text("alloc", s);
  for (size_t i = 0; i < n; ++i) {
    void *p;
    size_t len;
    kvt_block_data(&p, &len, m, b[i]);
    auto *c = static_cast<unsigned char *>(p);
    for (size_t k = 0; k < len; ++k) c[k] = static_cast<unsigned char>(rng());
    want.emplace_back(c, c + len);
    h[i] = first + i;
  }
  if (kvt_status s = kvt_block_register_hashes(reg.data(), m, b.data(), h.data(), n, 0);
      s != KVT_OK)
    return status_text("register", s);
  kvt_xfer *x = nullptr;
  if (kvt_status s = kvt_xfer_offload(&x, m, reg.data(), n, KVT_TIER_G3, nullptr, 0); s != KVT_OK)
    return status_text("offload", s);
  kvt_status s = kvt_xfer_wait(x, kWait);
  kvt_xfer_release(x);
  if (s != KVT_OK) return status_text("offload wait", s);
  kvt_block_release(m, reg.data(), n);
  // Evict G1 by taking its whole capacity, so that the bytes must come from G3.
  kvt_tier_stats st{};
  st.struct_size = sizeof st;
  kvt_tier_stats_get(&st, m, KVT_TIER_G1);
  std::vector<kvt_block> all(st.free + st.inactive);
  if (kvt_block_alloc(all.data(), all.size(), m, KVT_TIER_G1) != KVT_OK) return "evict G1";
  kvt_block_release(m, all.data(), all.size());
  size_t hit = 0;
  kvt_tier_match_prefix(&hit, src.data(), m, KVT_TIER_G3, h.data(), n);
  if (hit != n) return "G3 matched " + std::to_string(hit) + " of " + std::to_string(n);
  if ((s = kvt_block_alloc(dst.data(), n, m, KVT_TIER_G1)) != KVT_OK)
    return status_text("alloc dst", s);
  if ((s = kvt_xfer_onboard(&x, m, src.data(), dst.data(), n, nullptr, 0)) != KVT_OK)
    return status_text("onboard", s);
  s = kvt_xfer_wait(x, kWait);
  std::string err;
  if (s != KVT_OK) err = status_text("onboard wait", s);
  else kvt_xfer_blocks(fin.data(), n, x);
  kvt_xfer_release(x);
  for (size_t i = 0; err.empty() && i < n; ++i) {
    void *p;
    size_t len;
    kvt_block_data(&p, &len, m, fin[i]);
    if (std::memcmp(p, want[i].data(), len) != 0)
      err = "block " + std::to_string(i) + " came back different";
  }
  kvt_block_release(m, src.data(), n);
  kvt_block_release(m, s == KVT_OK ? fin.data() : dst.data(), n);
  if (err.empty() && kvt_manager_check(m) != KVT_OK)
    err = std::string("check: ") + kvt_last_error();
  return err;
}

// Runs fn in a forked child and returns what it reported: "" when it passed.
inline std::string in_child(const std::function<std::string()> &fn) {
  int p[2];
  if (pipe(p) != 0) return "pipe failed";
  pid_t pid = fork();
  if (pid == 0) {
    close(p[0]);
    std::string r = fn();
    if (!r.empty() && write(p[1], r.data(), r.size()) < 0) _exit(3);
    _exit(0);
  }
  close(p[1]);
  std::string out;
  char buf[512];
  for (ssize_t k; (k = read(p[0], buf, sizeof buf)) > 0;) out.append(buf, size_t(k));
  close(p[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    out += " (child ended with status " + std::to_string(status) + ")";
  return out;
}

// A child process that creates a manager with G3 in dir (NULL: a temporary directory) and
// holds it until it is killed.
class Owner {
 public:
  explicit Owner(const char *dir) {
    int p[2];
    if (pipe(p) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      close(p[0]);
      kvt_manager_config c = g3_config(dir);
      kvt_manager *m = nullptr;
      char ok = kvt_manager_create(&m, &c) == KVT_OK ? 'y' : 'n';
      if (write(p[1], &ok, 1) != 1) _exit(3);
      for (;;) pause();
    }
    close(p[1]);
    char ok = 0;
    ready_ = read(p[0], &ok, 1) == 1 && ok == 'y';
    close(p[0]);
  }
  ~Owner() { kill9(); }
  bool ready() const { return ready_; }
  void kill9() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

 private:
  pid_t pid_ = -1;
  bool ready_ = false;
};

}  // namespace kvt_test
