// The CUDA engine, on a real device: G1 in CUDA memory, offload to G2 and G3, onboard back,
// bytes compared. Without a device every test here skips and says so.
#include <cuda_runtime_api.h>

#include <cstring>
#include <filesystem>
#include <random>

#include "support.hpp"

using namespace kvt_test;

namespace {
bool have_device() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}
#define REQUIRE_GPU()                                                                  \
  if (!have_device()) GTEST_SKIP() << "SKIPPED: no CUDA device on this machine; the CUDA " \
                                      "engine is compiled but untested here"
}  // namespace

namespace {
void round_trip(uint32_t method) {
  char tmpl[] = "/tmp/kvtier-cuda-XXXXXX";
  std::string dir = mkdtemp(tmpl);
  kvt_manager_config c = small_config(8, 8, 8);
  c.g1_memory = KVT_MEMORY_CUDA;
  c.num_layers = 4;
  c.chunk_bytes = 8192;
  c.g3_path = dir.c_str();
  c.min_batch_size = 1;
  c.cuda_copy = method;
  auto m = make(c);
  ASSERT_EQ(stats(m.get(), KVT_TIER_G1).memory, uint32_t(KVT_MEMORY_CUDA));
  const size_t bytes = 4 * 2 * 8192;
  std::vector<uint64_t> h = {1, 2, 3};
  auto g1 = alloc(m.get(), 3);
  std::vector<std::vector<unsigned char>> want(3, std::vector<unsigned char>(bytes));
  std::mt19937 rng(1);
  for (size_t i = 0; i < 3; ++i) {
    for (auto &v : want[i]) v = uint8_t(rng());
    void *dev = nullptr;
    void *p;
    size_t len;
    EXPECT_KVT(kvt_block_data(&p, &len, m.get(), g1[i]), KVT_ERR_UNSUPPORTED);
    ASSERT_KVT_OK(kvt_block_chunk(&dev, m.get(), g1[i], 0, 0));
    ASSERT_EQ(cudaMemcpy(dev, want[i].data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
  }
  std::vector<kvt_block> reg(3);
  ASSERT_KVT_OK(kvt_block_register_hashes(reg.data(), m.get(), g1.data(), h.data(), 3, 0));
  for (kvt_tier dst : {KVT_TIER_G2, KVT_TIER_G3}) {
    kvt_xfer *x = nullptr;
    ASSERT_KVT_OK(kvt_offload(&x, m.get(), reg.data(), 3, dst, nullptr, 0));
    ASSERT_KVT_OK(kvt_xfer_wait(x, -1));
    kvt_xfer_release(x);
  }
  std::vector<kvt_block> g2(3);
  size_t n = 0;
  ASSERT_KVT_OK(kvt_match_prefix(&n, g2.data(), m.get(), KVT_TIER_G2, h.data(), 3));
  ASSERT_EQ(n, 3u);
  for (size_t i = 0; i < 3; ++i) {
    void *p;
    size_t len;
    ASSERT_KVT_OK(kvt_block_data(&p, &len, m.get(), g2[i]));
    EXPECT_EQ(std::memcmp(p, want[i].data(), bytes), 0) << "D2H block " << i;
  }
  for (kvt_tier from : {KVT_TIER_G2, KVT_TIER_G3}) {
    std::vector<kvt_block> src(3);
    ASSERT_KVT_OK(kvt_match_prefix(&n, src.data(), m.get(), from, h.data(), 3));
    ASSERT_EQ(n, 3u);
    // Empty G1 completely, so that the onboard, not the originals, provides the bytes.
    ASSERT_KVT_OK(kvt_block_release(m.get(), reg.data(), 3));
    auto all = alloc(m.get(), 8);
    ASSERT_KVT_OK(kvt_block_release(m.get(), all.data(), 8));
    auto dst = alloc(m.get(), 3);
    kvt_xfer *x = nullptr;
    ASSERT_KVT_OK(kvt_onboard(&x, m.get(), src.data(), dst.data(), 3, nullptr, 0));
    ASSERT_KVT_OK(kvt_xfer_wait(x, -1));
    std::vector<kvt_block> fin(3);
    ASSERT_KVT_OK(kvt_xfer_blocks(fin.data(), 3, x));
    EXPECT_EQ(fin, dst);
    kvt_xfer_release(x);
    for (size_t i = 0; i < 3; ++i) {
      void *dev = nullptr;
      ASSERT_KVT_OK(kvt_block_chunk(&dev, m.get(), fin[i], 0, 0));
      std::vector<unsigned char> got(bytes);
      ASSERT_EQ(cudaMemcpy(got.data(), dev, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
      EXPECT_EQ(got, want[i]) << "H2D from G" << from << " block " << i;
    }
    reg = fin;
    kvt_block_release(m.get(), src.data(), 3);
  }
  kvt_block_release(m.get(), reg.data(), 3);
  kvt_block_release(m.get(), g2.data(), 3);
  EXPECT_KVT(kvt_manager_check(m.get()), KVT_OK);
  m.reset();
  std::filesystem::remove_all(dir);
}
}  // namespace

TEST(Cuda, G1OnDeviceRoundTripsThroughG2AndG3Batched) {
  REQUIRE_GPU();
  round_trip(KVT_CUDA_COPY_BATCHED);
}

TEST(Cuda, G1OnDeviceRoundTripsThroughG2AndG3PerChunk) {
  REQUIRE_GPU();
  round_trip(KVT_CUDA_COPY_PER_CHUNK);
}
