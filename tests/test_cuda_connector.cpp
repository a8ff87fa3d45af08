// The connector's worker on a real device: the engine's KV cache is vLLM's per-layer device
// tensors, registered with kvt_connector_register_kv_caches. A request's layers are written
// on the device one at a time and stored to G2 as each is saved; a second request loads
// them back, and each layer is checked on the device as soon as its wait returns. Without a
// device the test skips and says so.
#include <cuda_runtime_api.h>

#include "connector_support.hpp"
#include "cuda_support.hpp"

using namespace kvt_conn_test;

namespace {
// A vLLM-layout cache (EngineCache: one device tensor per layer and K/V, gaps between
// blocks) in the connector tests' geometry, written and read as a forward and a check would.
struct DeviceG1 {
  EngineCache cache{kLayers * kOuter, kGpuBlocks, kChunk};
  kvt_g1_layout &layout = cache.layout;

  char *chunk(uint32_t b, uint32_t l, uint32_t o) const {
    return static_cast<char *>(cache.regions[l * kOuter + o]) + b * cache.strides[0];
  }
  // The forward writes layer l of block b: the KV of hash h (kv_byte, as the host tests).
  void write_layer(uint32_t b, uint32_t l, uint64_t h) {
    std::vector<uint8_t> bytes(kChunk);
    for (uint32_t o = 0; o < kOuter; ++o) {
      const size_t at = (l * kOuter + o) * kChunk;
      for (size_t k = 0; k < kChunk; ++k) bytes[k] = kv_byte(h, at + k);
      EXPECT_EQ(cudaMemcpy(chunk(b, l, o), bytes.data(), kChunk, cudaMemcpyHostToDevice),
                cudaSuccess);
    }
  }
  void poison(uint32_t b) {
    for (uint32_t l = 0; l < kLayers; ++l)
      for (uint32_t o = 0; o < kOuter; ++o)
        EXPECT_EQ(cudaMemset(chunk(b, l, o), 0x77, kChunk), cudaSuccess);
  }
  bool layer_holds(uint32_t b, uint32_t l, uint64_t h) const {
    std::vector<uint8_t> bytes(kChunk);
    for (uint32_t o = 0; o < kOuter; ++o) {
      const size_t at = (l * kOuter + o) * kChunk;
      if (cudaMemcpy(bytes.data(), chunk(b, l, o), kChunk, cudaMemcpyDeviceToHost) != cudaSuccess)
        return false;
      for (size_t k = 0; k < kChunk; ++k)
        if (bytes[k] != kv_byte(h, at + k)) return false;
    }
    return true;
  }
};

uint64_t stored_and_loaded(kvt_connector *c, uint64_t *loaded) {
  kvt_connector_stats s = cstats(c);
  *loaded = s.loaded_blocks;
  return s.stored_blocks;
}
}  // namespace

// A stores its two full blocks layer by layer from the device; B shares them and loads
// them, layer by layer, into other device blocks while its own third block is computed.
TEST(Cuda, ConnectorStoresDeviceLayersAsSavedAndLoadsEachBeforeItsWaitReturns) {
  if (!have_device())
    GTEST_SKIP() << "SKIPPED: no CUDA device on this machine; the connector's device copies "
                    "are compiled but untested here";
  ManagerPtr m = make(seed_manager_config(50));
  ASSERT_NE(m, nullptr);
  kvt_connector_config cc = connector_config();
  kvt_connector *c = nullptr;
  ASSERT_KVT_OK(kvt_connector_create(&c, m.get(), &cc));
  std::unique_ptr<kvt_connector, void (*)(kvt_connector *)> own(c, kvt_connector_destroy);
  DeviceG1 g1;
  ASSERT_KVT_OK(kvt_connector_register_kv_caches(c, &g1.layout, kGpuBlocks));

  const std::vector<uint32_t> a = seed_a(), b = seed_b();
  const std::vector<uint64_t> ha = hashes_of(a), hb = hashes_of(b);
  uint64_t n = 0, loaded = 0;
  int32_t async = -1;
  ASSERT_KVT_OK(kvt_connector_get_num_new_matched_tokens(&n, &async, c, "A", a.data(), a.size(), 0));
  ASSERT_EQ(n, 0u);
  const uint32_t a_blocks[] = {1, 2, 3};
  ASSERT_KVT_OK(kvt_connector_update_state_after_alloc(c, "A", a_blocks, 3, 0));
  std::string meta = build_meta(c, {{"A", 0, 40}});
  ASSERT_KVT_OK(kvt_connector_bind_connector_metadata(c, meta.data(), meta.size()));
  ASSERT_KVT_OK(kvt_connector_start_load_kv(c));
  for (uint32_t l = 0; l < kLayers; ++l) {
    g1.write_layer(1, l, ha[0]);
    g1.write_layer(2, l, ha[1]);
    ASSERT_KVT_OK(kvt_connector_wait_for_layer_load(c, l));
    ASSERT_KVT_OK(kvt_connector_save_kv_layer(c, l));
  }
  ASSERT_KVT_OK(kvt_connector_wait_for_save(c));
  Finished f;
  EXPECT_TRUE(drain(c, c, &f, [&] { return stored_and_loaded(c, &loaded) == 2; }))
      << "A's two blocks were not reported stored";
  ASSERT_KVT_OK(kvt_connector_clear_connector_metadata(c));
  int32_t delay = -1;
  ASSERT_KVT_OK(kvt_connector_request_finished(&delay, c, "A"));
  EXPECT_EQ(delay, 0);
  std::vector<kvt_block> in_g2;
  ASSERT_EQ(matched(m.get(), KVT_TIER_G2, ha, &in_g2), 2u);
  for (size_t i = 0; i < 2; ++i) {
    void *p = nullptr;
    size_t len = 0;
    ASSERT_KVT_OK(kvt_block_data(&p, &len, m.get(), in_g2[i]));
    EXPECT_TRUE(kv_equal(p, len, ha[i])) << "G2's copy of A's block " << i << " is wrong";
  }
  kvt_block_release(m.get(), in_g2.data(), in_g2.size());

  ASSERT_KVT_OK(kvt_connector_get_num_new_matched_tokens(&n, &async, c, "B", b.data(), b.size(), 0));
  ASSERT_EQ(n, 32u);
  const uint32_t b_blocks[] = {4, 5, 6, 7};
  ASSERT_KVT_OK(kvt_connector_update_state_after_alloc(c, "B", b_blocks, 4, 32));
  g1.poison(4);
  g1.poison(5);
  meta = build_meta(c, {{"B", 32, 20}});
  ASSERT_KVT_OK(kvt_connector_bind_connector_metadata(c, meta.data(), meta.size()));
  ASSERT_KVT_OK(kvt_connector_start_load_kv(c));
  for (uint32_t l = 0; l < kLayers; ++l) {
    g1.write_layer(6, l, hb[2]);
    ASSERT_KVT_OK(kvt_connector_wait_for_layer_load(c, l));
    EXPECT_TRUE(g1.layer_holds(4, l, ha[0]) && g1.layer_holds(5, l, ha[1]))
        << "layer " << l << " of B's loaded blocks was not on the device when its wait returned";
    ASSERT_KVT_OK(kvt_connector_save_kv_layer(c, l));
  }
  ASSERT_KVT_OK(kvt_connector_wait_for_save(c));
  EXPECT_TRUE(drain(c, c, &f, [&] { return stored_and_loaded(c, &loaded) == 3 && loaded == 2; }))
      << "B's load and its third block's store were not reported";
  ASSERT_KVT_OK(kvt_connector_clear_connector_metadata(c));
  ASSERT_KVT_OK(kvt_connector_request_finished(&delay, c, "B"));
  EXPECT_EQ(matched(m.get(), KVT_TIER_G2, hb), 3u);
  EXPECT_KVT(kvt_manager_check(m.get()), KVT_OK);
}
