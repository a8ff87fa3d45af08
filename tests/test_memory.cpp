// Block bytes: host stand-in G1, G2, engine-owned layouts, and G3's refusal.
#include <cstring>
#include <random>

#include "support.hpp"

using namespace kvt_test;

TEST(Memory, G1StandInAndG2BlocksAreDisjointAndKeepTheirBytes) {
  auto m = make(small_config(4, 4));
  const size_t block_bytes = 2 * 2 * 64;
  std::vector<kvt_block> all = alloc(m.get(), 4, KVT_TIER_G1);
  auto g2 = alloc(m.get(), 4, KVT_TIER_G2);
  all.insert(all.end(), g2.begin(), g2.end());
  std::vector<std::vector<unsigned char>> want;
  std::mt19937 rng(7);
  for (kvt_block b : all) {
    void *p = nullptr;
    size_t len = 0;
    ASSERT_KVT_OK(kvt_block_data(&p, &len, m.get(), b));
    ASSERT_EQ(len, block_bytes);
    ASSERT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
    std::vector<unsigned char> bytes(len);
    for (auto &x : bytes) x = static_cast<unsigned char>(rng());
    std::memcpy(p, bytes.data(), len);
    want.push_back(bytes);
  }
  for (size_t i = 0; i < all.size(); ++i) {
    void *p;
    size_t len;
    ASSERT_KVT_OK(kvt_block_data(&p, &len, m.get(), all[i]));
    EXPECT_EQ(std::memcmp(p, want[i].data(), len), 0) << "block " << i << " was overwritten";
    // Chunks are the block's pieces, back to back in (layer, outer) order.
    for (uint32_t l = 0; l < 2; ++l)
      for (uint32_t o = 0; o < 2; ++o) {
        void *c;
        ASSERT_KVT_OK(kvt_block_chunk(&c, m.get(), all[i], l, o));
        EXPECT_EQ(static_cast<char *>(c), static_cast<char *>(p) + (l * 2 + o) * 64);
      }
  }
  kvt_tier_stats s = stats(m.get(), KVT_TIER_G2);
  EXPECT_EQ(s.block_bytes, block_bytes);
  EXPECT_EQ(s.memory, uint32_t(KVT_MEMORY_HOST));
}

TEST(Memory, G2IsPageAligned) {
  auto m = make(small_config(1, 2));
  kvt_block b = alloc(m.get(), 1, KVT_TIER_G2)[0];
  void *p;
  size_t len;
  ASSERT_KVT_OK(kvt_block_data(&p, &len, m.get(), b));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 4096, 0u);
}

TEST(Memory, G3IsRefusedWithAClearStatus) {
  auto m = make(small_config(1, 1, 2));
  kvt_block b = alloc(m.get(), 1, KVT_TIER_G3)[0];
  void *p = nullptr;
  size_t len = 0;
  EXPECT_KVT(kvt_block_data(&p, &len, m.get(), b), KVT_ERR_UNSUPPORTED);
  EXPECT_NE(std::string(kvt_last_error()).find("disk"), std::string::npos);
  EXPECT_KVT(kvt_block_chunk(&p, m.get(), b, 0, 0), KVT_ERR_UNSUPPORTED);
  EXPECT_EQ(stats(m.get(), KVT_TIER_G3).memory, 0u);
}

TEST(Memory, UnreferencedBlockDataIsRefused) {
  auto m = make(small_config(2, 0));
  kvt_block b = store(m.get(), {1})[0];
  ASSERT_KVT_OK(kvt_block_release(m.get(), &b, 1));
  void *p;
  size_t len;
  EXPECT_KVT(kvt_block_data(&p, &len, m.get(), b), KVT_ERR_STATE);
}

namespace {
// A manager whose G1 is the engine's memory, described by one base and stride per
// (layer, outer).
ManagerPtr with_layout(uint32_t layers, uint32_t blocks, uint64_t chunk,
                       const std::vector<const void *> &bases,
                       const std::vector<uint64_t> &strides) {
  kvt_g1_layout lay{};
  lay.struct_size = sizeof lay;
  lay.memory = KVT_MEMORY_HOST;
  lay.bases = bases.data();
  lay.strides = strides.data();
  kvt_manager_config c = small_config(blocks, 0);
  c.num_layers = layers;
  c.chunk_bytes = chunk;
  c.g1_layout = &lay;
  return make(c);
}
}  // namespace

// vLLM's per-layer [2, num_blocks, ...] tensors: K and V of each layer in separate regions.
TEST(Memory, EngineLayoutPerLayerKV) {
  const uint32_t layers = 3, blocks = 5;
  const uint64_t chunk = 32;
  std::vector<unsigned char> mem(layers * 2 * blocks * chunk, 0);
  std::vector<const void *> bases;
  std::vector<uint64_t> strides;
  for (uint32_t l = 0; l < layers; ++l)
    for (uint32_t o = 0; o < 2; ++o) {
      bases.push_back(mem.data() + (l * 2 + o) * blocks * chunk);
      strides.push_back(chunk);
    }
  auto m = with_layout(layers, blocks, chunk, bases, strides);
  auto bs = alloc(m.get(), blocks);
  for (uint32_t i = 0; i < blocks; ++i)
    for (uint32_t l = 0; l < layers; ++l)
      for (uint32_t o = 0; o < 2; ++o) {
        void *p;
        ASSERT_KVT_OK(kvt_block_chunk(&p, m.get(), bs[i], l, o));
        // A fresh tier hands out slots in order, so block i is slot i.
        EXPECT_EQ(p, mem.data() + (l * 2 + o) * blocks * chunk + i * chunk);
        std::memset(p, int(1 + i * 16 + l * 2 + o), chunk);
      }
  // Every byte of the engine's memory was covered exactly once.
  for (size_t k = 0; k < mem.size(); ++k) ASSERT_NE(mem[k], 0) << k;
  void *p;
  size_t len;
  EXPECT_KVT(kvt_block_data(&p, &len, m.get(), bs[0]), KVT_ERR_UNSUPPORTED);
  EXPECT_NE(std::string(kvt_last_error()).find("kvt_block_chunk"), std::string::npos);
}

// A fully contiguous engine layout ([num_blocks, layers, 2, ...]) also serves kvt_block_data.
TEST(Memory, EngineLayoutContiguous) {
  const uint32_t layers = 2, blocks = 3;
  const uint64_t chunk = 16, block_bytes = layers * 2 * chunk;
  std::vector<unsigned char> mem(blocks * block_bytes);
  std::vector<const void *> bases;
  std::vector<uint64_t> strides;
  for (uint32_t i = 0; i < layers * 2; ++i) {
    bases.push_back(mem.data() + i * chunk);
    strides.push_back(block_bytes);
  }
  auto m = with_layout(layers, blocks, chunk, bases, strides);
  auto bs = alloc(m.get(), blocks);
  for (uint32_t i = 0; i < blocks; ++i) {
    void *p;
    size_t len;
    ASSERT_KVT_OK(kvt_block_data(&p, &len, m.get(), bs[i]));
    EXPECT_EQ(p, mem.data() + i * block_bytes);
    EXPECT_EQ(len, block_bytes);
  }
}

TEST(Memory, ZeroByteBlocksCarryMetadataOnly) {
  kvt_manager_config c = small_config(4, 4);
  c.chunk_bytes = 0;
  auto m = make(c);
  kvt_block b = alloc(m.get(), 1)[0];
  void *p = reinterpret_cast<void *>(1);
  size_t len = 9;
  ASSERT_KVT_OK(kvt_block_data(&p, &len, m.get(), b));
  EXPECT_EQ(len, 0u);
  EXPECT_EQ(p, nullptr);
}
