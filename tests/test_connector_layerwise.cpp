// The worker half's copies layer by layer, as vLLM's layer hooks drive them: after
// wait_for_layer_load(L), layer L of every load of the step is in G1; a store reads layer L
// only after save_kv_layer(L) (or wait_for_save, for a layer whose hook never came); a G3
// load that fails its checksum writes no layer of its G1 block. Each for G2 and for G3.
#include "connector_support.hpp"

using namespace kvt_conn_test;

namespace {

constexpr uint64_t kLayerBytes = kOuter * kChunk;  // a layer of a block, contiguous in G1

// Layer l of G1 block b holds the KV of hash h, at the offsets of the whole block's KV.
bool layer_holds(EngineG1 &g1, uint32_t b, uint32_t l, uint64_t h) {
  for (size_t k = l * kLayerBytes; k < (l + 1) * kLayerBytes; ++k)
    if (g1.block(b)[k] != kv_byte(h, k)) return false;
  return true;
}

// The forward of layer l: block b gets that layer of the KV of hash h.
void write_layer(EngineG1 &g1, uint32_t b, uint32_t l, uint64_t h) {
  for (size_t k = l * kLayerBytes; k < (l + 1) * kLayerBytes; ++k) g1.block(b)[k] = kv_byte(h, k);
}

bool all_bytes(EngineG1 &g1, uint32_t b, uint8_t v) {
  return uint64_t(std::count(g1.block(b), g1.block(b) + kBlock, v)) == kBlock;
}

// A rig whose stores go to `tier` (G2, or G3 in dir).
struct TierRig : Rig {
  TierRig(kvt_tier tier, const TempDir &dir)
      : Rig(connector_config(KVT_ROLE_BOTH, KVT_OFFLOAD_EAGER, tier),
            tier == KVT_TIER_G2 ? seed_manager_config(50)
                                : seed_manager_config(0, 50, dir.path.c_str())) {}
};

class ConnectorLayerwise : public ::testing::TestWithParam<kvt_tier> {
 protected:
  TempDir dir_;
};

// Tokens of a request that shares A's two blocks and then goes its own way.
std::vector<uint32_t> a_prefix_then(uint32_t first) {
  return concat(token_range(1000, 32), token_range(first, 20));
}

}  // namespace

// B and C, two requests of one step, each load A's two blocks; every wait_for_layer_load(L)
// returns with layer L of all four loaded blocks in G1. The step's new KV of layer L is
// written before that layer's wait, as vLLM does, and is stored whole.
TEST_P(ConnectorLayerwise, EveryLoadOfTheStepHoldsLayerLOnceItsWaitReturns) {
  TierRig r(GetParam(), dir_);
  ASSERT_NE(r.c, nullptr);
  auto b = a_prefix_then(2000), c = a_prefix_then(3000);
  auto ha = hashes_of(seed_a()), hb = hashes_of(b), hc = hashes_of(c);
  r.run_a();
  ASSERT_EQ(r.match("B", b).first, 32u);
  ASSERT_KVT_OK(r.alloc("B", {4, 5, 6, 7}, 32));
  ASSERT_EQ(r.match("C", c).first, 32u);
  ASSERT_KVT_OK(r.alloc("C", {8, 9, 10, 11}, 32));
  for (uint32_t blk : {4, 5, 8, 9}) r.g1.fill(blk, 0x77);
  const std::string meta = r.meta({{"B", 32, 20}, {"C", 32, 20}});
  ASSERT_KVT_OK(kvt_connector_bind_connector_metadata(r.c, meta.data(), meta.size()));
  ASSERT_KVT_OK(kvt_connector_start_load_kv(r.c));
  const std::pair<uint32_t, uint64_t> loads[] = {{4, ha[0]}, {5, ha[1]}, {8, ha[0]}, {9, ha[1]}};
  for (uint32_t l = 0; l < kLayers; ++l) {
    write_layer(r.g1, 6, l, hb[2]);
    write_layer(r.g1, 10, l, hc[2]);
    ASSERT_KVT_OK(kvt_connector_wait_for_layer_load(r.c, l));
    for (auto [blk, h] : loads)
      EXPECT_TRUE(layer_holds(r.g1, blk, l, h))
          << "layer " << l << " of G1 block " << blk << " was not loaded when its wait returned";
    ASSERT_KVT_OK(kvt_connector_save_kv_layer(r.c, l));
  }
  ASSERT_KVT_OK(kvt_connector_wait_for_save(r.c));
  Finished f;
  EXPECT_TRUE(drain(r.c, r.c, &f, r.counts(4, 4)));
  ASSERT_KVT_OK(kvt_connector_clear_connector_metadata(r.c));
  EXPECT_TRUE(f.load_errors.empty());
  EXPECT_EQ(r.held(hb, GetParam()), 3u);
  EXPECT_EQ(r.held(hc, GetParam()), 3u);
  if (GetParam() == KVT_TIER_G2) {
    EXPECT_EQ(r.g2_holding(hb), 3u);
    EXPECT_EQ(r.g2_holding(hc), 3u);
  }
  EXPECT_EQ(r.finish("B"), 0);
  EXPECT_EQ(r.finish("C"), 0);
  EXPECT_KVT(kvt_manager_check(r.m.get()), KVT_OK);
}

// A's blocks hold stale bytes until the forward writes each layer, after start_load_kv and
// just before that layer's save_kv_layer; the last layer's hook never comes (vLLM skips some),
// and its bytes are written just before wait_for_save. The stored blocks hold the new bytes of
// every layer: read back from G2, or loaded back from G3 by B.
TEST_P(ConnectorLayerwise, StoresReadALayerOnlyOnceItIsSaved) {
  TierRig r(GetParam(), dir_);
  ASSERT_NE(r.c, nullptr);
  auto a = seed_a(), b = seed_b();
  auto ha = hashes_of(a);
  ASSERT_EQ(r.match("A", a).first, 0u);
  ASSERT_KVT_OK(r.alloc("A", {1, 2, 3}, 0));
  r.g1.fill(1, 0x5a);
  r.g1.fill(2, 0x5a);
  const std::string meta = r.meta({{"A", 0, 40}});
  ASSERT_KVT_OK(kvt_connector_bind_connector_metadata(r.c, meta.data(), meta.size()));
  ASSERT_KVT_OK(kvt_connector_start_load_kv(r.c));
  for (uint32_t l = 0; l < kLayers; ++l) {
    ASSERT_KVT_OK(kvt_connector_wait_for_layer_load(r.c, l));
    write_layer(r.g1, 1, l, ha[0]);
    write_layer(r.g1, 2, l, ha[1]);
    if (l + 1 < kLayers) ASSERT_KVT_OK(kvt_connector_save_kv_layer(r.c, l));
  }
  ASSERT_KVT_OK(kvt_connector_wait_for_save(r.c));
  Finished f;
  EXPECT_TRUE(drain(r.c, r.c, &f, r.counts(2, 0)));
  ASSERT_KVT_OK(kvt_connector_clear_connector_metadata(r.c));
  EXPECT_EQ(r.finish("A"), 0);
  if (GetParam() == KVT_TIER_G2) {
    EXPECT_EQ(r.g2_holding(ha), 2u) << "a store read a stale layer";
  }

  ASSERT_EQ(r.match("B", b).first, 32u);
  ASSERT_KVT_OK(r.alloc("B", {4, 5, 6, 7}, 32));
  bool loaded = false;
  r.step(r.meta({{"B", 32, 20}}), {}, r.counts(3, 2),
         [&] { loaded = r.g1.holds(4, ha[0]) && r.g1.holds(5, ha[1]); });
  EXPECT_TRUE(loaded) << "B loaded stale bytes: a store read a layer before it was saved";
  EXPECT_EQ(r.finish("B"), 0);
  EXPECT_KVT(kvt_manager_check(r.m.get()), KVT_OK);
}

INSTANTIATE_TEST_SUITE_P(Tiers, ConnectorLayerwise, ::testing::Values(KVT_TIER_G2, KVT_TIER_G3),
                         [](const auto &info) {
                           return std::string(info.param == KVT_TIER_G2 ? "G2" : "G3");
                         });

// One of A's blocks fails its checksum in G3: at every wait_for_layer_load, the good block
// holds that layer and the bad one none of its bytes changed; the bad block is reported.
TEST(ConnectorLayerwiseG3, ABlockFailingItsChecksumIsWrittenInNoLayer) {
  TempDir dir;
  TierRig r(KVT_TIER_G3, dir);
  ASSERT_NE(r.c, nullptr);
  auto b = seed_b();
  auto ha = hashes_of(seed_a()), hb = hashes_of(b);
  r.run_a();
  ASSERT_GE(corrupt_g3_block(dir.path, ha[1], 50), 0) << "no G3 slot holds A's second block";
  ASSERT_EQ(r.match("B", b).first, 32u);
  ASSERT_KVT_OK(r.alloc("B", {4, 5, 6, 7}, 32));
  r.g1.fill(4, 0x77);
  r.g1.fill(5, 0x77);
  const std::string meta = r.meta({{"B", 32, 20}});
  ASSERT_KVT_OK(kvt_connector_bind_connector_metadata(r.c, meta.data(), meta.size()));
  ASSERT_KVT_OK(kvt_connector_start_load_kv(r.c));
  for (uint32_t l = 0; l < kLayers; ++l) {
    write_layer(r.g1, 6, l, hb[2]);
    ASSERT_KVT_OK(kvt_connector_wait_for_layer_load(r.c, l));
    EXPECT_TRUE(layer_holds(r.g1, 4, l, ha[0])) << "layer " << l << " of the good block";
    EXPECT_TRUE(all_bytes(r.g1, 5, 0x77)) << "layer " << l << ": the corrupt block was written";
    ASSERT_KVT_OK(kvt_connector_save_kv_layer(r.c, l));
  }
  ASSERT_KVT_OK(kvt_connector_wait_for_save(r.c));
  Finished f;
  EXPECT_TRUE(drain(r.c, r.c, &f, [&] {
    return r.stats().load_errors == 1 && r.stats().store_failures == 1;
  }));
  ASSERT_KVT_OK(kvt_connector_clear_connector_metadata(r.c));
  EXPECT_EQ(f.load_errors, std::vector<uint32_t>{5});
  EXPECT_TRUE(all_bytes(r.g1, 5, 0x77)) << "the corrupt block was written after the step";
  EXPECT_EQ(r.stats().loaded_blocks, 1u);
  EXPECT_EQ(r.finish("B"), 0);
}
