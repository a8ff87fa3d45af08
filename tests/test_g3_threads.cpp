// G3 batches from several threads at once (max_concurrent_transfers > 1): the I/O paths hold
// a lock only to take or hand back work, and every byte still comes back checked. Run
// under TSan, with io_uring and with the I/O threads.
#include <random>
#include <thread>

#include "test_g3_support.hpp"

using namespace kvt_test;

namespace {

constexpr int kThreads = 4, kRounds = 6;
constexpr size_t kBlocks = 6;
const int64_t kWait = int64_t(30) * 1000 * 1000 * 1000;

uint64_t hash_of(int t, int round, size_t i) { return 1000 * (t + 1) + 10 * round + i + 1; }

// Thread t's offloads: kRounds transfers of kBlocks fresh blocks each. Records the bytes.
std::string offload_rounds(kvt_manager *m, int t, std::vector<std::vector<unsigned char>> *want) {
  std::mt19937 rng(t);
  for (int round = 0; round < kRounds; ++round) {
    std::vector<kvt_block> b(kBlocks), r(kBlocks);
    std::vector<uint64_t> h(kBlocks);
    if (kvt_status s = kvt_block_alloc(b.data(), kBlocks, m, KVT_TIER_G1); s != KVT_OK)
      return status_text("alloc", s);
    for (size_t i = 0; i < kBlocks; ++i) {
      void *p;
      size_t len;
      kvt_block_data(&p, &len, m, b[i]);
      auto *c = static_cast<unsigned char *>(p);
      for (size_t k = 0; k < len; ++k) c[k] = static_cast<unsigned char>(rng());
      want->emplace_back(c, c + len);
      h[i] = hash_of(t, round, i);
    }
    kvt_block_register_hashes(r.data(), m, b.data(), h.data(), kBlocks, 0);
    kvt_xfer *x = nullptr;
    if (kvt_status s = kvt_xfer_offload(&x, m, r.data(), kBlocks, KVT_TIER_G3, nullptr, 0);
        s != KVT_OK)
      return status_text("offload", s);
    kvt_status s = kvt_xfer_wait(x, kWait);
    kvt_xfer_release(x);
    kvt_block_release(m, r.data(), kBlocks);
    if (s != KVT_OK) return status_text("offload wait", s);
  }
  return "";
}

// Thread t's onboards of the same blocks, compared with what was offloaded.
std::string onboard_rounds(kvt_manager *m, int t,
                           const std::vector<std::vector<unsigned char>> &want) {
  for (int round = 0; round < kRounds; ++round) {
    std::vector<kvt_block> src(kBlocks), dst(kBlocks), fin(kBlocks);
    std::vector<uint64_t> h(kBlocks);
    for (size_t i = 0; i < kBlocks; ++i) h[i] = hash_of(t, round, i);
    size_t hit = 0;
    kvt_tier_match_prefix(&hit, src.data(), m, KVT_TIER_G3, h.data(), kBlocks);
    if (hit != kBlocks) return "G3 matched " + std::to_string(hit);
    if (kvt_status s = kvt_block_alloc(dst.data(), kBlocks, m, KVT_TIER_G1); s != KVT_OK)
      return status_text("alloc", s);
    kvt_xfer *x = nullptr;
    if (kvt_status s = kvt_xfer_onboard(&x, m, src.data(), dst.data(), kBlocks, nullptr, 0);
        s != KVT_OK)
      return status_text("onboard", s);
    kvt_status s = kvt_xfer_wait(x, kWait);
    std::string err = s == KVT_OK ? "" : status_text("onboard wait", s);
    if (s == KVT_OK) kvt_xfer_blocks(fin.data(), kBlocks, x);
    kvt_xfer_release(x);
    for (size_t i = 0; err.empty() && i < kBlocks; ++i) {
      void *p;
      size_t len;
      kvt_block_data(&p, &len, m, fin[i]);
      if (std::memcmp(p, want[size_t(round) * kBlocks + i].data(), len) != 0)
        err = "round " + std::to_string(round) + " block " + std::to_string(i) + " differs";
    }
    kvt_block_release(m, src.data(), kBlocks);
    kvt_block_release(m, s == KVT_OK ? fin.data() : dst.data(), kBlocks);
    if (!err.empty()) return err;
  }
  return "";
}

}  // namespace

TEST(Threads, G3BatchesFromSeveralThreadsOverlapSafely) {
  for (uint32_t io : {uint32_t(KVT_IO_AUTO), uint32_t(KVT_IO_THREADS)}) {
    TempDir dir;
    kvt_manager_config c = g3_config(dir.path.c_str(), 256);
    c.g1_blocks = 128;
    c.max_concurrent_transfers = 4;
    c.copy_threads = 3;
    c.g3_io = test_g3_io(io);
    auto m = make(c);
    ASSERT_TRUE(m);
    std::vector<std::vector<std::vector<unsigned char>>> want(kThreads);
    std::vector<std::string> errors(kThreads);
    auto all = [&](auto phase) {
      std::vector<std::thread> ts;
      for (int t = 0; t < kThreads; ++t) ts.emplace_back([&, t] { errors[t] = phase(t); });
      for (auto &th : ts) th.join();
      for (int t = 0; t < kThreads; ++t)
        EXPECT_EQ(errors[t], "") << "thread " << t << ", g3_io " << io;
    };
    all([&](int t) { return offload_rounds(m.get(), t, &want[t]); });
    // Evict G1, so that the onboards read G3.
    kvt_tier_stats s = stats(m.get(), KVT_TIER_G1);
    auto b = alloc(m.get(), s.free + s.inactive);
    ASSERT_KVT_OK(kvt_block_release(m.get(), b.data(), b.size()));
    all([&](int t) { return onboard_rounds(m.get(), t, want[t]); });
    EXPECT_KVT(kvt_manager_check(m.get()), KVT_OK);
  }
}
