// CopySet, the copies of one batch as the pipeline's executor (whole blocks) and the
// connector's worker (a layer at a time) run them: host copies land byte for byte, and a
// copy that needs a CUDA engine that is not there fails its own owners only. And the
// SegmentCursor the CUDA engine takes its runs from (and the memcpy engine's lists are made
// with): the runs the layouts place, however few it is asked for at a time.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "copy/copy_set.hpp"
#include "copy/worker_pool.hpp"
#include "memory/tier_memory.hpp"

namespace {

using namespace kvt;

constexpr Geometry kGeo{3, 2, 64};  // 3 layers, K and V, 64-byte chunks

// An engine-owned G1 of `blocks` blocks whose chunks are scattered: chunk (layer, outer) of
// block b at bases[layer * 2 + outer] + b * stride. `kind` may claim CUDA for host bytes, so
// that the set routes it to the CUDA engine; nothing here ever copies them.
struct EngineG1 {
  std::vector<char> bytes;
  std::vector<const void *> bases;
  std::vector<uint64_t> strides;
  TierMemory mem;
  EngineG1(uint32_t blocks, kvt_memory_kind kind) {
    const uint64_t stride = 2 * kGeo.chunk_bytes;  // a gap after each chunk
    const size_t pairs = size_t{kGeo.num_layers} * kGeo.num_outer;
    bytes.assign(pairs * blocks * stride, 0);
    for (size_t p = 0; p < pairs; ++p) {
      bases.push_back(bytes.data() + p * blocks * stride);
      strides.push_back(stride);
    }
    kvt_g1_layout l{};
    l.struct_size = sizeof l;
    l.memory = kind;
    l.bases = bases.data();
    l.strides = strides.data();
    mem.init_engine(kGeo, l);
  }
};

std::vector<char> chunk(const TierMemory &m, uint32_t slot, uint32_t layer, uint32_t outer) {
  const char *p = static_cast<const char *>(m.chunk(slot, layer, outer));
  return {p, p + kGeo.chunk_bytes};
}

TEST(CopySet, WholeBlocksAndSingleLayersLandAndAMissingCudaEngineFailsItsOwnersOnly) {
  TierMemory g2;
  ASSERT_EQ(g2.init_host(4, kGeo, false), KVT_OK);
  auto *src = static_cast<unsigned char *>(g2.block(0));
  for (uint64_t i = 0; i < kGeo.block_bytes(); ++i) src[i] = static_cast<unsigned char>(i * 7 + 1);
  EngineG1 host_g1(4, KVT_MEMORY_HOST), device_g1(4, KVT_MEMORY_CUDA);
  WorkerPool pool(1);

  CopySet set(kGeo);
  EXPECT_TRUE(set.empty());
  set.add({{&g2, 2, nullptr}, {&g2, 0, nullptr}}, 0);            // G2 -> G2, whole
  set.add_layer({{&host_g1.mem, 3, nullptr}, {&g2, 0, nullptr}}, 1, 1);  // G2 -> G1, layer 1
  set.add({{&device_g1.mem, 1, nullptr}, {&g2, 0, nullptr}}, 2);  // to "CUDA": no engine
  set.add_layer({{&g2, 3, nullptr}, {&device_g1.mem, 0, nullptr}}, 0, 3);  // from "CUDA"
  EXPECT_FALSE(set.empty());
  const std::vector<CopySet::Failure> failed = set.run(nullptr, pool);

  EXPECT_EQ(std::memcmp(g2.block(2), g2.block(0), kGeo.block_bytes()), 0);
  for (uint32_t layer = 0; layer < kGeo.num_layers; ++layer)
    for (uint32_t outer = 0; outer < kGeo.num_outer; ++outer) {
      const std::vector<char> got = chunk(host_g1.mem, 3, layer, outer);
      if (layer == 1)
        EXPECT_EQ(got, chunk(g2, 0, layer, outer)) << "outer " << outer;
      else
        EXPECT_EQ(got, std::vector<char>(kGeo.chunk_bytes, 0)) << "layer " << layer;
    }
  ASSERT_EQ(failed.size(), 2u);
  for (const CopySet::Failure &f : failed) {
    EXPECT_TRUE(f.owner == 2 || f.owner == 3) << f.owner;
    EXPECT_EQ(f.status, KVT_ERR_UNSUPPORTED);
    EXPECT_NE(f.message.find("no CUDA copy engine"), std::string::npos) << f.message;
  }
  EXPECT_NE(failed[0].owner, failed[1].owner);
  for (char c : device_g1.bytes) ASSERT_EQ(c, 0) << "a failed copy wrote";
  const auto *g2_3 = static_cast<const char *>(g2.block(3));
  EXPECT_EQ(std::vector<char>(g2_3, g2_3 + kGeo.block_bytes()),
            std::vector<char>(kGeo.block_bytes(), 0));
}

void expect_runs(const Segment *got, const std::vector<Segment> &want, const std::string &how) {
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].dst, want[i].dst) << how << ", run " << i;
    EXPECT_EQ(got[i].src, want[i].src) << how << ", run " << i;
    EXPECT_EQ(got[i].len, want[i].len) << how << ", run " << i;
  }
}

TEST(SegmentCursor, MakesTheRunsOfTheListsInOrderWhateverItIsAskedForAtATime) {
  TierMemory g2;
  ASSERT_EQ(g2.init_host(4, kGeo, false), KVT_OK);
  EngineG1 g1(4, KVT_MEMORY_CUDA);
  std::vector<char> staging(kGeo.block_bytes());
  const std::vector<SegmentCursor::Part> parts = {
      {{{&g1.mem, 2, nullptr}, {&g2, 0, nullptr}}, SegmentCursor::kWholeBlock},  // 6 chunks
      {{{&g2, 1, nullptr}, {&g2, 3, nullptr}}, SegmentCursor::kWholeBlock},      // 1 run
      {{{&g1.mem, 0, nullptr}, {nullptr, 0, staging.data()}}, 2},               // 2 chunks
      {{{&g2, 2, nullptr}, {&g2, 0, nullptr}}, 1},                              // 1 run
      {{{&g1.mem, 3, nullptr}, {&g2, 1, nullptr}}, 0},                          // 2 chunks
  };
  // The runs as the layouts place them: a scattered side chunk by chunk, a compact or
  // staging block's chunk (layer, outer) at (layer * 2 + outer) * 64.
  auto at = [](const TierMemory &m, uint32_t slot, uint64_t pair) {
    return static_cast<char *>(m.block(slot)) + pair * kGeo.chunk_bytes;
  };
  auto ch = [](const TierMemory &m, uint32_t slot, uint32_t l, uint32_t o) {
    return static_cast<char *>(m.chunk(slot, l, o));
  };
  std::vector<Segment> want;
  for (uint32_t l = 0; l < 3; ++l)
    for (uint32_t o = 0; o < 2; ++o)
      want.push_back({ch(g1.mem, 2, l, o), at(g2, 0, l * 2 + o), 64});
  want.push_back({at(g2, 1, 0), at(g2, 3, 0), kGeo.block_bytes()});
  for (uint32_t o = 0; o < 2; ++o)
    want.push_back({ch(g1.mem, 0, 2, o), staging.data() + (4 + o) * 64, 64});
  want.push_back({at(g2, 2, 2), at(g2, 0, 2), 128});
  for (uint32_t o = 0; o < 2; ++o) want.push_back({ch(g1.mem, 3, 0, o), at(g2, 1, o), 64});
  ASSERT_EQ(want.size(), 12u);
  std::vector<Segment> appended;  // the same runs, a block at a time
  for (const SegmentCursor::Part &p : parts)
    if (p.layer == SegmentCursor::kWholeBlock)
      append_segments(kGeo, p.copy, appended);
    else
      append_layer_segments(kGeo, p.copy, p.layer, appended);
  ASSERT_EQ(appended.size(), want.size());
  expect_runs(appended.data(), want, "append_*");
  for (size_t cap : {size_t{1}, size_t{2}, size_t{5}, size_t{64}}) {
    SegmentCursor cursor(kGeo, parts);
    EXPECT_EQ(cursor.size(), want.size());
    std::vector<Segment> got(want.size() + cap);
    size_t made = 0;
    for (size_t n; (n = cursor.next(got.data() + made, cap)) > 0;) {
      ASSERT_LE(n, cap);
      made += n;
      ASSERT_LE(made, want.size());
    }
    ASSERT_EQ(made, want.size()) << "cap " << cap;
    EXPECT_EQ(cursor.next(got.data(), cap), 0u) << "after the end";
    expect_runs(got.data(), want, "cap " + std::to_string(cap));
  }
  constexpr Geometry kEmpty{3, 2, 0};
  SegmentCursor none(kEmpty, parts);
  Segment one{};
  EXPECT_EQ(none.size(), 0u);
  EXPECT_EQ(none.next(&one, 1), 0u);
}

}  // namespace
