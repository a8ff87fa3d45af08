// A persistent G3 (g3_persist): its blocks come back after a clean destroy and after kill -9
// at any moment (never a torn one), a file of another layout is refused or reset, a second
// owner is refused while the first lives, keyed slots (g3_key_env) that no writer without the
// key can forge, and the config is validated.
#include <sys/mman.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <thread>

#include "test_g3_support.hpp"

using namespace kvt_test;

namespace {

constexpr int64_t kWait = int64_t(30) * 1000 * 1000 * 1000;

kvt_manager_config persist_config(const std::string &dir, uint64_t g3 = 16) {
  kvt_manager_config c = g3_config(dir.c_str(), g3);
  c.g1_blocks = 32;
  c.g3_persist = 1;
  return c;
}

// The bytes a block of hash h holds: a function of h alone, so that any process can check them.
void fill(void *p, size_t len, uint64_t h) {
  uint64_t x = h * 0x9e3779b97f4a7c15ULL + 1;
  for (size_t k = 0; k + 8 <= len; k += 8) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    std::memcpy(static_cast<char *>(p) + k, &x, 8);
  }
}

// Registers G1 blocks of hashes h (bytes from fill of h + salt) and offloads them to G3; ""
// or an error.
std::string offload(kvt_manager *m, const std::vector<uint64_t> &h, uint64_t salt = 0) {
  size_t n = h.size();
  std::vector<kvt_block> b(n), reg(n);
  if (kvt_status s = kvt_block_alloc(b.data(), n, m, KVT_TIER_G1); s != KVT_OK)
    return status_text("alloc", s);
  for (size_t i = 0; i < n; ++i) {
    void *p;
    size_t len;
    kvt_block_data(&p, &len, m, b[i]);
    fill(p, len, h[i] + salt);
  }
  if (kvt_status s = kvt_block_register_hashes(reg.data(), m, b.data(), h.data(), n, 0);
      s != KVT_OK)
    return status_text("register", s);
  kvt_xfer *x = nullptr;
  kvt_status s = kvt_xfer_offload(&x, m, reg.data(), n, KVT_TIER_G3, nullptr, 0);
  if (s == KVT_OK) {
    s = kvt_xfer_wait(x, kWait);
    kvt_xfer_release(x);
  }
  kvt_block_release(m, reg.data(), n);
  return s == KVT_OK ? "" : status_text("offload", s);
}

// Onboards the G3 blocks of hashes h into G1 and compares each one's bytes with fill's.
std::string onboard_and_compare(kvt_manager *m, const std::vector<uint64_t> &h) {
  size_t n = h.size();
  std::vector<kvt_block> src(n), dst(n), fin(n);
  size_t hit = 0;
  kvt_tier_match_prefix(&hit, src.data(), m, KVT_TIER_G3, h.data(), n);
  if (hit != n) {
    kvt_block_release(m, src.data(), hit);
    return "G3 matched " + std::to_string(hit) + " of " + std::to_string(n);
  }
  std::string err;
  kvt_xfer *x = nullptr;
  kvt_status s = kvt_block_alloc(dst.data(), n, m, KVT_TIER_G1);
  if (s == KVT_OK) s = kvt_xfer_onboard(&x, m, src.data(), dst.data(), n, nullptr, 0);
  if (s == KVT_OK) {
    s = kvt_xfer_wait(x, kWait);
    if (s == KVT_OK) kvt_xfer_blocks(fin.data(), n, x);
    kvt_xfer_release(x);
  }
  if (s != KVT_OK) err = status_text("onboard", s);
  std::vector<unsigned char> want;
  for (size_t i = 0; err.empty() && i < n; ++i) {
    void *p;
    size_t len;
    kvt_block_data(&p, &len, m, fin[i]);
    want.resize(len);
    fill(want.data(), len, h[i]);
    if (std::memcmp(p, want.data(), len) != 0)
      err = "block 0x" + std::to_string(h[i]) + " came back different";
  }
  kvt_block_release(m, src.data(), n);
  kvt_block_release(m, err.empty() ? fin.data() : dst.data(), n);
  return err;
}

std::vector<uint64_t> range(uint64_t first, size_t n) {
  std::vector<uint64_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = first + i;
  return v;
}

std::string create_error(const kvt_manager_config &c, kvt_status want) {
  kvt_manager *m = nullptr;
  kvt_status s = kvt_manager_create(&m, &c);
  if (s == KVT_OK) kvt_manager_destroy(m);
  if (s != want) return status_text("create", s);
  return kvt_last_error();
}

std::string g3_file(const TempDir &d) { return d.path + "/kvtier-g3.bin"; }

}  // namespace

TEST(G3Persist, RecoversAfterCleanDestroy) {
  TempDir dir;
  auto h = range(1000, 12);
  {
    auto m = make(persist_config(dir.path));
    ASSERT_TRUE(m);
    ASSERT_EQ(offload(m.get(), h), "");
    EXPECT_EQ(stats(m.get(), KVT_TIER_G3).recovered, 0u);
  }
  ASSERT_TRUE(std::filesystem::exists(g3_file(dir))) << "destroy removed a persistent file";
  auto m = make(persist_config(dir.path));
  ASSERT_TRUE(m);
  kvt_tier_stats g3 = stats(m.get(), KVT_TIER_G3);
  EXPECT_EQ(g3.recovered, h.size());
  EXPECT_EQ(g3.registered, h.size());
  EXPECT_EQ(g3.inactive, h.size());
  EXPECT_EQ(g3.free, 16 - h.size());
  EXPECT_EQ(stats(m.get(), KVT_TIER_G1).registered, 0u) << "G1 starts empty";
  EXPECT_EQ(drain(m.get()).size(), 0u) << "recovery emits no events";
  ASSERT_KVT_OK(kvt_manager_check(m.get()));
  EXPECT_EQ(onboard_and_compare(m.get(), h), "");
  // New blocks take the free slots, then evict recovered ones.
  ASSERT_EQ(offload(m.get(), range(5000, 6)), "");
  EXPECT_EQ(stats(m.get(), KVT_TIER_G3).registered, 16u);
  EXPECT_EQ(matched(m.get(), KVT_TIER_G3, range(5000, 6)), 6u);
  ASSERT_KVT_OK(kvt_manager_check(m.get()));
}

TEST(G3Persist, ResetEmptiesTheFileToo) {
  TempDir dir;
  {
    auto m = make(persist_config(dir.path));
    ASSERT_TRUE(m);
    ASSERT_EQ(offload(m.get(), range(1, 4)), "");
    ASSERT_KVT_OK(kvt_manager_reset(m.get(), KVT_TIER_G3));
    ASSERT_EQ(offload(m.get(), range(10, 2)), "");
  }
  auto m = make(persist_config(dir.path));
  ASSERT_TRUE(m);
  EXPECT_EQ(stats(m.get(), KVT_TIER_G3).recovered, 2u) << "blocks reset came back";
  EXPECT_EQ(matched(m.get(), KVT_TIER_G3, range(1, 1)), 0u);
  EXPECT_EQ(onboard_and_compare(m.get(), range(10, 2)), "");
}

TEST(G3Persist, ChecksumVerifiedOnRead) {
  TempDir dir;
  {
    auto m = make(persist_config(dir.path, 4));
    ASSERT_TRUE(m);
    ASSERT_EQ(offload(m.get(), {7}), "");
  }
  {  // Flip the first data byte of every slot: past the 4 KiB header and the 4 KiB table.
    std::fstream f(g3_file(dir), std::ios::in | std::ios::out | std::ios::binary);
    for (int s = 0; s < 4; ++s) {
      f.seekp(8192 + s * 8192);
      f.put('\x5a');
    }
  }
  auto m = make(persist_config(dir.path, 4));
  ASSERT_TRUE(m);
  ASSERT_EQ(stats(m.get(), KVT_TIER_G3).recovered, 1u);
  std::string err = onboard_and_compare(m.get(), {7});
  EXPECT_NE(err.find("KVT_ERR_CORRUPT"), std::string::npos) << err;
  EXPECT_EQ(matched(m.get(), KVT_TIER_G3, {7}), 0u) << "a corrupt block stayed registered";
}

// A child offloads blocks of known bytes to a small persistent G3 without pause (every slot
// is overwritten again and again) and is killed at a random moment; the parent recovers the
// file and checks every block it recovered, byte by byte. Repeated on the same file.
TEST(G3Persist, KillNineAtRandomMomentsRecoversOnlyWholeBlocks) {
  TempDir dir;
  constexpr int kRounds = 24;
  constexpr uint64_t kPerRound = uint64_t(1) << 32;
  auto *next = static_cast<std::atomic<uint64_t> *>(
      mmap(nullptr, sizeof(std::atomic<uint64_t>), PROT_READ | PROT_WRITE,
           MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(next, MAP_FAILED);
  std::mt19937 rng(std::random_device{}());
  // Blocks of 512 KiB, so that the writer spends much of its time inside slot writes.
  kvt_manager_config c = persist_config(dir.path, 32);
  c.chunk_bytes = 128 << 10;
  const int slow = RUNNING_ON_VALGRIND ? 10 : 1;
  uint64_t total_recovered = 0, total_written = 0;
  std::vector<uint64_t> present;  // what the last check found in G3
  for (int round = 0; round < kRounds; ++round) {
    const uint64_t base = (round + 1) * kPerRound;
    next->store(base);
    pid_t pid = fork();
    if (pid == 0) {
      kvt_manager *m = nullptr;
      if (kvt_manager_create(&m, &c) != KVT_OK) _exit(2);
      for (;;) {
        uint64_t first = next->load();
        next->store(first + 4);  // before any of them is written: the parent checks up to it
        if (!offload(m, range(first, 4)).empty()) _exit(3);
      }
    }
    ASSERT_GT(pid, 0);
    std::this_thread::sleep_for(std::chrono::milliseconds((30 + rng() % 120) * slow));
    kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status)) << "the writer ended by itself: status " << status;
    total_written += next->load() - base;

    auto m = make(c);
    ASSERT_TRUE(m);
    // A hash can be in G3 only if this round's writer may have started it, or if the last
    // round's check found it there: one lookup each.
    std::vector<uint64_t> candidates = present;
    for (uint64_t h = base; h < next->load(); ++h) candidates.push_back(h);
    present.clear();
    for (uint64_t h : candidates)
      if (matched(m.get(), KVT_TIER_G3, {h}) == 1) present.push_back(h);
    kvt_tier_stats g3 = stats(m.get(), KVT_TIER_G3);
    ASSERT_EQ(g3.recovered, present.size()) << "round " << round;
    total_recovered += g3.recovered;
    for (uint64_t h : present) ASSERT_EQ(onboard_and_compare(m.get(), {h}), "") << "round " << round;
    ASSERT_KVT_OK(kvt_manager_check(m.get()));
  }
  munmap(next, sizeof(std::atomic<uint64_t>));
  EXPECT_GT(total_written, uint64_t(kRounds) * 4) << "the writer hardly wrote";
  EXPECT_GT(total_recovered, uint64_t(kRounds)) << "almost nothing was recovered";
  std::printf("kill -9 loop: %d rounds, %llu blocks offloaded, %llu recovered and verified\n",
              kRounds, (unsigned long long)total_written, (unsigned long long)total_recovered);
}

TEST(G3Persist, IncompatibleFileRefusedOrReset) {
  TempDir dir;
  {
    auto m = make(persist_config(dir.path));
    ASSERT_TRUE(m);
    ASSERT_EQ(offload(m.get(), range(1, 3)), "");
  }
  struct Change {
    const char *field;
    void (*apply)(kvt_manager_config &);
  } changes[] = {
      {"page_size", [](kvt_manager_config &c) { c.page_size = 8; }},
      {"num_layers", [](kvt_manager_config &c) { c.num_layers = 1; }},
      {"num_outer", [](kvt_manager_config &c) { c.num_outer = 1; }},
      {"chunk_bytes", [](kvt_manager_config &c) { c.chunk_bytes = 512; }},
      {"g3_blocks", [](kvt_manager_config &c) { c.g3_blocks = 32; }},
      {"g3_namespace", [](kvt_manager_config &c) { c.g3_namespace = 42; }},
  };
  for (const Change &ch : changes) {
    kvt_manager_config c = persist_config(dir.path);
    ch.apply(c);
    std::string msg = create_error(c, KVT_ERR_INVALID_ARGUMENT);
    EXPECT_NE(msg.find(ch.field), std::string::npos) << msg;
    EXPECT_NE(msg.find("KVT_G3_RESET"), std::string::npos) << msg;
  }
  {  // Nothing was touched: the file still serves its own layout.
    auto m = make(persist_config(dir.path));
    ASSERT_TRUE(m);
    EXPECT_EQ(stats(m.get(), KVT_TIER_G3).recovered, 3u);
  }
  {  // Another format version (bytes 8..11 of the header).
    std::fstream f(g3_file(dir), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(8);
    uint32_t v = 2;
    f.write(reinterpret_cast<const char *>(&v), sizeof v);
  }
  std::string msg = create_error(persist_config(dir.path), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_NE(msg.find("format version 2"), std::string::npos) << msg;
  {
    LogCapture log;
    kvt_manager_config c = persist_config(dir.path);
    c.g3_on_mismatch = KVT_G3_RESET;
    c.g3_namespace = 42;
    auto m = make(c);
    ASSERT_TRUE(m);
    EXPECT_EQ(stats(m.get(), KVT_TIER_G3).recovered, 0u);
    EXPECT_EQ(log.find(KVT_LOG_WARN, "starts empty").size(), 1u);
    ASSERT_EQ(offload(m.get(), range(100, 2)), "");
  }
  {  // The reset file is the new namespace's, with its blocks.
    kvt_manager_config c = persist_config(dir.path);
    c.g3_namespace = 42;
    auto m = make(c);
    ASSERT_TRUE(m);
    EXPECT_EQ(stats(m.get(), KVT_TIER_G3).recovered, 2u);
    EXPECT_EQ(onboard_and_compare(m.get(), range(100, 2)), "");
  }
  // Not a G3 file at all: refused, never overwritten unless asked.
  const std::string other = "someone else's data, not a kvtier file";
  std::ofstream(g3_file(dir), std::ios::trunc) << other;
  msg = create_error(persist_config(dir.path), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_NE(msg.find("not a kvtier G3 file"), std::string::npos) << msg;
  EXPECT_EQ(std::filesystem::file_size(g3_file(dir)), other.size());
}

TEST(G3Persist, SecondOwnerRefusedWhileTheFirstLives) {
  TempDir dir;
  int p[2];
  ASSERT_EQ(pipe(p), 0);
  pid_t pid = fork();
  if (pid == 0) {
    close(p[0]);
    kvt_manager_config c = persist_config(dir.path);
    kvt_manager *m = nullptr;
    char ok = kvt_manager_create(&m, &c) == KVT_OK && offload(m, range(1, 2)).empty() ? 'y' : 'n';
    if (write(p[1], &ok, 1) != 1) _exit(3);
    for (;;) pause();
  }
  close(p[1]);
  char ok = 0;
  ASSERT_EQ(read(p[0], &ok, 1), 1);
  close(p[0]);
  ASSERT_EQ(ok, 'y');
  std::string msg = create_error(persist_config(dir.path), KVT_ERR_STATE);
  EXPECT_NE(msg.find("in use"), std::string::npos) << msg;
  EXPECT_NE(msg.find(std::to_string(pid)), std::string::npos) << "the holder is not named: " << msg;
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);

  auto m = make(persist_config(dir.path));
  ASSERT_TRUE(m);
  EXPECT_EQ(stats(m.get(), KVT_TIER_G3).recovered, 2u);
  // A second manager in this process is refused too, and the first goes on unharmed.
  msg = create_error(persist_config(dir.path), KVT_ERR_STATE);
  EXPECT_NE(msg.find("in use"), std::string::npos) << msg;
  EXPECT_EQ(onboard_and_compare(m.get(), range(1, 2)), "");
}

TEST(G3Persist, ConfigValidated) {
  TempDir dir;
  kvt_manager_config c = persist_config(dir.path);
  c.g3_persist = 2;
  EXPECT_NE(create_error(c, KVT_ERR_INVALID_ARGUMENT).find("g3_persist"), std::string::npos);
  c = persist_config(dir.path);
  c.g3_path = nullptr;
  EXPECT_NE(create_error(c, KVT_ERR_INVALID_ARGUMENT).find("g3_path"), std::string::npos);
  c = persist_config(dir.path);
  c.g3_blocks = 0;
  EXPECT_NE(create_error(c, KVT_ERR_INVALID_ARGUMENT).find("g3_persist"), std::string::npos);
  c = persist_config(dir.path);
  c.g3_on_mismatch = 2;
  EXPECT_NE(create_error(c, KVT_ERR_INVALID_ARGUMENT).find("g3_on_mismatch"), std::string::npos);
  const std::string absent = dir.path + "/absent";
  c = persist_config(absent);
  std::string msg = create_error(c, KVT_ERR_IO);
  EXPECT_NE(msg.find("absent"), std::string::npos) << msg;
  EXPECT_FALSE(std::filesystem::exists(g3_file(dir))) << "a refused config left a file";
}

// g3_key_env, for a G3 file others can write: slots written without the key, with another
// key, or copied from another namespace's file are refused on read (KVT_ERR_CORRUPT, the block
// leaves G3), never served; what the key wrote comes back byte for byte.
TEST(G3Persist, KeyedSlotsNoOtherWriterCanForge) {
  setenv("KVT_TEST_G3_KEY_A", "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff",
         1);
  setenv("KVT_TEST_G3_KEY_B", "ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100",
         1);
  auto keyed = [](const TempDir &d, const char *env, uint64_t ns = 1) {
    kvt_manager_config c = persist_config(d.path, 4);
    c.g3_key_env = env;
    c.g3_namespace = ns;
    return c;
  };
  auto write = [](const kvt_manager_config &c, uint64_t salt = 0) {
    auto m = make(c);
    ASSERT_TRUE(m);
    EXPECT_EQ(offload(m.get(), {7}, salt), "");
  };
  // Refused on its first read, with the reason; the block is gone from G3 afterwards.
  auto refused = [](const kvt_manager_config &c) {
    auto m = make(c);
    ASSERT_TRUE(m);
    ASSERT_EQ(stats(m.get(), KVT_TIER_G3).recovered, 1u);
    const std::string err = onboard_and_compare(m.get(), {7});
    EXPECT_NE(err.find("KVT_ERR_CORRUPT"), std::string::npos) << err;
    EXPECT_NE(err.find("g3_key_env"), std::string::npos) << err;
    EXPECT_EQ(matched(m.get(), KVT_TIER_G3, {7}), 0u);
  };

  TempDir own, plain, other, ns_x, ns_y;
  write(keyed(own, "KVT_TEST_G3_KEY_A"));
  {
    auto m = make(keyed(own, "KVT_TEST_G3_KEY_A"));
    ASSERT_TRUE(m);
    EXPECT_EQ(onboard_and_compare(m.get(), {7}), "") << "the key's own slot";
  }
  // A writer without the key (its checksums are right), and one with another key.
  kvt_manager_config unkeyed = persist_config(plain.path, 4);
  unkeyed.g3_namespace = 1;
  write(unkeyed);
  refused(keyed(plain, "KVT_TEST_G3_KEY_A"));
  write(keyed(other, "KVT_TEST_G3_KEY_B"));
  refused(keyed(other, "KVT_TEST_G3_KEY_A"));
  // A valid slot of the same key and hash, copied from another namespace's file over this
  // one's (same slot, data and header): another model's KV under this model's hash.
  write(keyed(ns_x, "KVT_TEST_G3_KEY_A", 1));
  write(keyed(ns_y, "KVT_TEST_G3_KEY_A", 2), 100);
  {
    std::ifstream from(g3_file(ns_x), std::ios::binary);
    std::string slot(8192, '\0');
    from.seekg(8192);  // slot 0: past the file header and the one-page table
    from.read(slot.data(), 8192);
    std::fstream to(g3_file(ns_y), std::ios::in | std::ios::out | std::ios::binary);
    to.seekp(8192);
    to.write(slot.data(), 8192);
  }
  refused(keyed(ns_y, "KVT_TEST_G3_KEY_A", 2));
  // A keyed file read without the key: its slots cannot be checked, so none is served.
  kvt_manager_config no_key = persist_config(own.path, 4);
  no_key.g3_namespace = 1;
  {
    auto m = make(no_key);
    ASSERT_TRUE(m);
    const std::string err = onboard_and_compare(m.get(), {7});
    EXPECT_NE(err.find("KVT_ERR_CORRUPT"), std::string::npos) << err;
  }
  // A temporary G3 with a key: the same round trip as without.
  kvt_manager_config temp = g3_config(nullptr, 16);
  temp.g3_key_env = "KVT_TEST_G3_KEY_A";
  auto t = make(temp);
  ASSERT_TRUE(t);
  EXPECT_EQ(g3_roundtrip(t.get(), 1, 8, 3), "");
  unsetenv("KVT_TEST_G3_KEY_A");
  unsetenv("KVT_TEST_G3_KEY_B");
}

TEST(G3Persist, AKeyVariableThatIsUnsetOrNotAKeyIsRefused) {
  TempDir dir;
  kvt_manager_config c = persist_config(dir.path, 4);
  c.g3_key_env = "KVT_TEST_G3_KEY_UNSET";
  unsetenv("KVT_TEST_G3_KEY_UNSET");
  std::string msg = create_error(c, KVT_ERR_INVALID_ARGUMENT);
  EXPECT_NE(msg.find("g3_key_env"), std::string::npos) << msg;
  EXPECT_NE(msg.find("not set"), std::string::npos) << msg;
  setenv("KVT_TEST_G3_KEY_SHORT", "secret-and-not-hex", 1);
  c.g3_key_env = "KVT_TEST_G3_KEY_SHORT";
  msg = create_error(c, KVT_ERR_INVALID_ARGUMENT);
  EXPECT_NE(msg.find("64 hex digits"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("secret"), std::string::npos) << "the message shows the variable: " << msg;
  unsetenv("KVT_TEST_G3_KEY_SHORT");
  c = persist_config(dir.path, 4);
  c.g3_persist = 0;
  c.g3_blocks = 0;
  c.g3_key_env = "KVT_TEST_G3_KEY_UNSET";
  msg = create_error(c, KVT_ERR_INVALID_ARGUMENT);
  EXPECT_NE(msg.find("no G3"), std::string::npos) << msg;
}
