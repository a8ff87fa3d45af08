// The connector's worker half driven directly (kvt::conn::Worker, internal), with metadata
// encoded here. With stores_end_by_next_step (what kvt_connector_config.sliding_window
// turns on), handle_preemptions and start_load_kv of the next step return only once the
// stores of earlier steps have ended: their G2 slots hold the bytes the earlier forward
// wrote, and the report hands their batches back, before the engine writes G1 again.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "abi/objects.hpp"
#include "block/tier.hpp"
#include "connector/metadata.hpp"
#include "connector/worker.hpp"

namespace {

using kvt::conn::Batch;
using kvt::conn::CopyOp;
using kvt::conn::Meta;
using kvt::conn::Report;
using kvt::conn::Worker;

// Blocks large enough (1 MiB) that a step's stores outlast the calls between two steps.
constexpr uint32_t kLayers = 4, kOuter = 2, kPage = 16, kBlocks = 16;
constexpr uint64_t kChunk = 128 << 10, kBlock = kLayers * kOuter * kChunk;

uint8_t byte_of(uint64_t step, uint32_t block, size_t k) {
  return uint8_t(step * 31 + block * 7 + k % 251);
}

struct Host {
  kvt_manager *m = nullptr;
  std::vector<uint8_t> g1 = std::vector<uint8_t>(kBlocks * kBlock);
  std::vector<const void *> bases;
  std::vector<uint64_t> strides;
  kvt_g1_layout layout{};

  Host() {
    kvt_manager_config c;
    kvt_manager_config_init(&c);
    c.page_size = kPage;
    c.num_layers = kLayers;
    c.num_outer = kOuter;
    c.chunk_bytes = kChunk;
    c.g1_blocks = 1;  // the engine owns G1
    c.g2_blocks = 2 * kBlocks;
    c.g1_memory = KVT_MEMORY_HOST;
    EXPECT_EQ(kvt_manager_create(&m, &c), KVT_OK) << kvt_last_error();
    for (uint32_t i = 0; i < kLayers * kOuter; ++i) {
      bases.push_back(g1.data() + i * kChunk);
      strides.push_back(kBlock);
    }
    layout.struct_size = sizeof layout;
    layout.memory = KVT_MEMORY_HOST;
    layout.bases = bases.data();
    layout.strides = strides.data();
  }
  ~Host() { kvt_manager_destroy(m); }
  kvt::Manager &manager() { return *m->impl; }

  // The forward of a step: every G1 block gets that step's bytes.
  void forward(uint64_t step) {
    for (uint32_t b = 0; b < kBlocks; ++b)
      for (size_t k = 0; k < kBlock; ++k) g1[b * kBlock + k] = byte_of(step, b, k);
  }
  // G2 slot s holds what G1 block b held in `step`.
  bool g2_holds(uint32_t s, uint64_t step, uint32_t b) {
    const auto *p = static_cast<const uint8_t *>(
        manager().tier_if_present(KVT_TIER_G2)->memory().block(s));
    for (size_t k = 0; k < kBlock; ++k)
      if (p[k] != byte_of(step, b, k)) return false;
    return true;
  }
};

// Step `step`: one batch storing every G1 block to G2 slots of its own.
std::string store_meta(uint64_t step) {
  Meta meta;
  meta.shape = {kPage, 2 * kBlocks, 0, 1};
  meta.step = step;
  Batch b{step, "R" + std::to_string(step), {}};
  for (uint32_t g1 = 0; g1 < kBlocks; ++g1)
    b.ops.push_back(CopyOp{g1, KVT_TIER_G2, uint32_t(step % 2 * kBlocks + g1), step << 32 | g1, 0});
  meta.stores.push_back(std::move(b));
  return kvt::conn::encode(meta);
}

// The worker's side of a step, after_start (the engine's view once start_load_kv returned)
// before the forward.
void run_step(Worker &w, Host &h, uint64_t step, const std::function<void()> &after_start) {
  const std::string meta = store_meta(step);
  ASSERT_EQ(w.bind(meta.data(), meta.size()), KVT_OK) << kvt_last_error();
  ASSERT_EQ(w.start_load_kv(), KVT_OK) << kvt_last_error();
  after_start();
  h.forward(step);
  for (uint32_t l = 0; l < kLayers; ++l) {
    ASSERT_EQ(w.wait_for_layer_load(l), KVT_OK) << kvt_last_error();
    ASSERT_EQ(w.save_kv_layer(l), KVT_OK) << kvt_last_error();
  }
  ASSERT_EQ(w.wait_for_save(), KVT_OK) << kvt_last_error();
  ASSERT_EQ(w.clear(), KVT_OK) << kvt_last_error();
}

std::vector<uint64_t> stores_done(Worker &w) {
  kvt_finished f{};
  f.struct_size = sizeof f;
  EXPECT_EQ(w.get_finished(&f), KVT_OK) << kvt_last_error();
  Report r;
  EXPECT_EQ(kvt::conn::decode(&r, f.report, f.report_len), KVT_OK) << kvt_last_error();
  std::vector<uint64_t> ids;
  for (const auto &d : r.stores) {
    EXPECT_TRUE(d.failed.empty()) << "store batch " << d.id << " failed";
    ids.push_back(d.id);
  }
  return ids;
}

}  // namespace

TEST(ConnectorWorker, StoresEndByNextStepEndBeforeTheNextStartLoadKvReturns) {
  Host h;
  ASSERT_NE(h.m, nullptr);
  Worker w(h.manager(), 1, 0, true);
  ASSERT_EQ(w.register_kv_caches(h.layout, kBlocks), KVT_OK) << kvt_last_error();
  for (uint64_t step = 1; step <= 5; ++step) {
    run_step(w, h, step, [&] {
      const uint64_t prev = step - 1;
      EXPECT_EQ(stores_done(w), prev ? std::vector<uint64_t>{prev} : std::vector<uint64_t>{})
          << "step " << prev << "'s stores had not ended when step " << step << " started";
      for (uint32_t b = 0; prev && b < kBlocks; ++b)
        EXPECT_TRUE(h.g2_holds(uint32_t(prev % 2 * kBlocks + b), prev, b))
            << "step " << prev << ", block " << b;
    });
  }
}

// vLLM calls handle_preemptions first in every step, then zeroes the step's new blocks
// (Mamba hybrids), then start_load_kv: the zeroing must not reach a block an earlier step's
// store still reads.
TEST(ConnectorWorker, StoresEndByNextStepEndBeforeTheNextHandlePreemptionsReturns) {
  Host h;
  ASSERT_NE(h.m, nullptr);
  Worker w(h.manager(), 1, 0, true);
  ASSERT_EQ(w.register_kv_caches(h.layout, kBlocks), KVT_OK) << kvt_last_error();
  for (uint64_t step = 1; step <= 5; ++step) {
    ASSERT_EQ(w.handle_preemptions(nullptr, 0), KVT_OK) << kvt_last_error();
    const uint64_t prev = step - 1;
    EXPECT_EQ(stores_done(w), prev ? std::vector<uint64_t>{prev} : std::vector<uint64_t>{})
        << "step " << prev << "'s stores had not ended when step " << step << " began";
    std::fill(h.g1.begin(), h.g1.end(), uint8_t(0));  // the engine zeroes reused blocks
    for (uint32_t b = 0; prev && b < kBlocks; ++b)
      EXPECT_TRUE(h.g2_holds(uint32_t(prev % 2 * kBlocks + b), prev, b))
          << "step " << prev << ", block " << b;
    run_step(w, h, step, [] {});
  }
}
