// The CUDA engine on a real device: G1 in CUDA memory, library-owned or the engine's own
// per-layer tensors; offload to G2 and G3 and onboard back, bytes compared; fences from CUDA
// events; cancellation and destroy while copies are in flight. Without a device every test
// here skips and says so.
#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <thread>

#include "cuda_support.hpp"
#include "support.hpp"

using namespace kvt_test;

namespace {
#define REQUIRE_GPU()                                                                  \
  if (!have_device()) GTEST_SKIP() << "SKIPPED: no CUDA device on this machine; the CUDA " \
                                      "engine is compiled but untested here"
#define ASSERT_CUDA(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

using Bytes = std::vector<unsigned char>;

Bytes random_bytes(size_t n, uint32_t seed) {
  Bytes b(n);
  std::mt19937 rng(seed);
  for (auto &v : b) v = uint8_t(rng());
  return b;
}

struct Geometry {
  uint32_t layers = 4, outer = 2;
  uint64_t chunk = 8192;
  uint64_t block_bytes() const { return uint64_t(layers) * outer * chunk; }
};

// Host bytes to a G1 block on the device and back, chunk by chunk through kvt_block_chunk:
// G2's block layout, chunk (layer, outer) at ((layer * outer_count) + outer) * chunk.
void write_g1(kvt_manager *m, kvt_block b, const Geometry &g, const Bytes &src) {
  for (uint32_t l = 0; l < g.layers; ++l)
    for (uint32_t o = 0; o < g.outer; ++o) {
      void *dev = nullptr;
      ASSERT_KVT_OK(kvt_block_chunk(&dev, m, b, l, o));
      ASSERT_CUDA(cudaMemcpy(dev, src.data() + (l * g.outer + o) * g.chunk, g.chunk,
                             cudaMemcpyHostToDevice));
    }
}
Bytes read_g1(kvt_manager *m, kvt_block b, const Geometry &g) {
  Bytes out(g.block_bytes());
  for (uint32_t l = 0; l < g.layers; ++l)
    for (uint32_t o = 0; o < g.outer; ++o) {
      void *dev = nullptr;
      EXPECT_EQ(kvt_block_chunk(&dev, m, b, l, o), KVT_OK) << kvt_last_error();
      EXPECT_EQ(cudaMemcpy(out.data() + (l * g.outer + o) * g.chunk, dev, g.chunk,
                           cudaMemcpyDeviceToHost),
                cudaSuccess);
    }
  return out;
}
Bytes read_g2(kvt_manager *m, kvt_block b) {
  void *p = nullptr;
  size_t len = 0;
  EXPECT_EQ(kvt_block_data(&p, &len, m, b), KVT_OK) << kvt_last_error();
  const auto *c = static_cast<const unsigned char *>(p);
  return Bytes(c, c + len);
}

kvt_manager_config cuda_config(const Geometry &g, uint64_t g1, uint64_t g2, uint64_t g3,
                               const char *dir) {
  kvt_manager_config c = small_config(g1, g2, g3);
  c.g1_memory = KVT_MEMORY_CUDA;
  c.num_layers = g.layers;
  c.num_outer = g.outer;
  c.chunk_bytes = g.chunk;
  c.g3_path = dir;
  c.min_batch_size = 1;
  return c;
}

// G1 on the device -> G2 -> G3, then back into an emptied G1 from each, bytes compared at
// every step. engine_owned: G1 is the engine's per-layer tensors (kvt_g1_layout). together:
// both offloads are enqueued before either is awaited, so that a batch can hold copies to
// mapped G2 and to G3's staging buffers both (the executor decides; the bytes must land
// either way).
void round_trip(uint32_t method, bool engine_owned, size_t blocks = 3, bool together = false) {
  TempDir dir;
  const Geometry g;
  const size_t kBlocks = blocks, kG1 = kBlocks + 8;
  EngineCache cache(g.layers * g.outer, kG1, g.chunk);
  kvt_manager_config c = cuda_config(g, kG1, kG1, kG1, dir.path.c_str());
  c.cuda_copy = method;
  c.max_batch_size = uint32_t(2 * kBlocks);
  if (engine_owned) c.g1_layout = &cache.layout;
  auto m = make(c);
  ASSERT_TRUE(m);
  ASSERT_EQ(stats(m.get(), KVT_TIER_G1).memory, uint32_t(KVT_MEMORY_CUDA));
  std::vector<uint64_t> h(kBlocks);
  for (size_t i = 0; i < kBlocks; ++i) h[i] = i + 1;
  auto g1 = alloc(m.get(), kBlocks);
  std::vector<Bytes> want;
  for (size_t i = 0; i < kBlocks; ++i) {
    want.push_back(random_bytes(g.block_bytes(), uint32_t(i + 1)));
    void *p;
    size_t len;
    EXPECT_KVT(kvt_block_data(&p, &len, m.get(), g1[i]), KVT_ERR_UNSUPPORTED);
    write_g1(m.get(), g1[i], g, want[i]);
  }
  std::vector<kvt_block> reg(kBlocks);
  ASSERT_KVT_OK(kvt_block_register_hashes(reg.data(), m.get(), g1.data(), h.data(), kBlocks, 0));
  std::vector<kvt_xfer *> offloads;
  for (kvt_tier dst : {KVT_TIER_G2, KVT_TIER_G3}) {
    kvt_xfer *x = nullptr;
    ASSERT_KVT_OK(kvt_xfer_offload(&x, m.get(), reg.data(), kBlocks, dst, nullptr, 0));
    offloads.push_back(x);
    if (!together) ASSERT_KVT_OK(kvt_xfer_wait(x, -1));
  }
  for (kvt_xfer *x : offloads) {
    EXPECT_KVT(kvt_xfer_wait(x, -1), KVT_OK);
    kvt_xfer_release(x);
  }
  std::vector<kvt_block> g2(kBlocks);
  size_t n = 0;
  ASSERT_KVT_OK(kvt_tier_match_prefix(&n, g2.data(), m.get(), KVT_TIER_G2, h.data(), kBlocks));
  ASSERT_EQ(n, kBlocks);
  for (size_t i = 0; i < kBlocks; ++i) EXPECT_EQ(read_g2(m.get(), g2[i]), want[i]) << "D2H " << i;
  for (kvt_tier from : {KVT_TIER_G2, KVT_TIER_G3}) {
    std::vector<kvt_block> src(kBlocks);
    ASSERT_KVT_OK(kvt_tier_match_prefix(&n, src.data(), m.get(), from, h.data(), kBlocks));
    ASSERT_EQ(n, kBlocks);
    // Empty G1 completely and scribble over it, so that the onboard provides the bytes.
    ASSERT_KVT_OK(kvt_block_release(m.get(), reg.data(), kBlocks));
    auto all = alloc(m.get(), kG1);
    for (kvt_block b : all) write_g1(m.get(), b, g, Bytes(g.block_bytes(), 0x5A));
    ASSERT_KVT_OK(kvt_block_release(m.get(), all.data(), kG1));
    auto dst = alloc(m.get(), kBlocks);
    kvt_xfer *x = nullptr;
    ASSERT_KVT_OK(kvt_xfer_onboard(&x, m.get(), src.data(), dst.data(), kBlocks, nullptr, 0));
    ASSERT_KVT_OK(kvt_xfer_wait(x, -1));
    std::vector<kvt_block> fin(kBlocks);
    ASSERT_KVT_OK(kvt_xfer_blocks(fin.data(), kBlocks, x));
    EXPECT_EQ(fin, dst);
    kvt_xfer_release(x);
    for (size_t i = 0; i < kBlocks; ++i)
      EXPECT_EQ(read_g1(m.get(), fin[i], g), want[i]) << "H2D from G" << from << " block " << i;
    reg = fin;
    kvt_block_release(m.get(), src.data(), kBlocks);
  }
  kvt_block_release(m.get(), reg.data(), kBlocks);
  kvt_block_release(m.get(), g2.data(), kBlocks);
  EXPECT_KVT(kvt_manager_check(m.get()), KVT_OK);
}

// A host function on a stream that holds every later operation of that stream until
// released: the stand-in for an engine's forward pass that is still running.
struct StreamGate {
  std::atomic<bool> open{false};
  static void CUDART_CB hold(void *self) {
    auto *g = static_cast<StreamGate *>(self);
    while (!g->open.load()) std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
};
}  // namespace

TEST(Cuda, G1OnDeviceRoundTripsThroughG2AndG3Batched) {
  REQUIRE_GPU();
  round_trip(KVT_CUDA_COPY_BATCHED, false);
}

TEST(Cuda, G1OnDeviceRoundTripsThroughG2AndG3PerChunk) {
  REQUIRE_GPU();
  round_trip(KVT_CUDA_COPY_PER_CHUNK, false);
}

TEST(Cuda, EngineOwnedG1OnDeviceRoundTripsThroughG2AndG3Batched) {
  REQUIRE_GPU();
  round_trip(KVT_CUDA_COPY_BATCHED, true);
}

TEST(Cuda, EngineOwnedG1OnDeviceRoundTripsThroughG2AndG3PerChunk) {
  REQUIRE_GPU();
  round_trip(KVT_CUDA_COPY_PER_CHUNK, true);
}

// The kernel reads and writes the pinned G2 directly; G3's copies go through staging memory
// that is not mapped, and so through the batched path, in the same run.
TEST(Cuda, G1OnDeviceRoundTripsThroughG2AndG3Kernel) {
  REQUIRE_GPU();
  round_trip(KVT_CUDA_COPY_KERNEL, false);
}

TEST(Cuda, EngineOwnedG1OnDeviceRoundTripsThroughG2AndG3Kernel) {
  REQUIRE_GPU();
  round_trip(KVT_CUDA_COPY_KERNEL, true);
}

TEST(Cuda, EngineOwnedG1OnDeviceRoundTripsThroughG2AndG3Auto) {
  REQUIRE_GPU();
  round_trip(KVT_CUDA_COPY_AUTO, true);
}

// 96 blocks of 8 chunks. With the engine's scattered G1 that is 768 runs each way, which the
// kernel takes in launches of 128, 256 and 384 as its table fills; library-owned G1 blocks
// are one run each. G3's runs go the batched way, beside the kernel's when they share a batch.
TEST(Cuda, ManyBlocksCrossInSeveralKernelLaunchesBesideBatchedStagingCopies) {
  REQUIRE_GPU();
  round_trip(KVT_CUDA_COPY_KERNEL, true, 96, true);
  round_trip(KVT_CUDA_COPY_KERNEL, false, 96, true);
}

// The engine writes a block on its stream and records an event; the offload waits on a
// fence from that event, so G2 receives the bytes written after the offload was enqueued.
TEST(Cuda, OffloadWaitsForTheFenceOfACudaEventAndCopiesWhatTheStreamWrote) {
  REQUIRE_GPU();
  TempDir dir;
  const Geometry g;
  EngineCache cache(g.layers * g.outer, 4, g.chunk);
  kvt_manager_config c = cuda_config(g, 4, 4, 0, dir.path.c_str());
  c.g1_layout = &cache.layout;
  auto m = make(c);
  ASSERT_TRUE(m);
  auto g1 = alloc(m.get(), 1);
  write_g1(m.get(), g1[0], g, Bytes(g.block_bytes(), 0x11));
  kvt_block reg = 0;
  ASSERT_KVT_OK(kvt_block_register_hash(&reg, m.get(), g1[0], 42, 0));

  cudaStream_t stream;
  ASSERT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  unsigned char *pinned = nullptr;
  ASSERT_CUDA(cudaMallocHost(reinterpret_cast<void **>(&pinned), g.block_bytes()));
  const Bytes fresh = random_bytes(g.block_bytes(), 7);
  std::memcpy(pinned, fresh.data(), fresh.size());
  StreamGate gate;
  ASSERT_CUDA(cudaLaunchHostFunc(stream, StreamGate::hold, &gate));
  for (uint32_t l = 0; l < g.layers; ++l)
    for (uint32_t o = 0; o < g.outer; ++o) {
      void *dev = nullptr;
      ASSERT_KVT_OK(kvt_block_chunk(&dev, m.get(), reg, l, o));
      ASSERT_CUDA(cudaMemcpyAsync(dev, pinned + (l * g.outer + o) * g.chunk, g.chunk,
                                  cudaMemcpyHostToDevice, stream));
    }
  cudaEvent_t written;
  ASSERT_CUDA(cudaEventCreateWithFlags(&written, cudaEventDisableTiming));
  ASSERT_CUDA(cudaEventRecord(written, stream));

  kvt_fence *f = nullptr;
  ASSERT_KVT_OK(kvt_fence_from_cuda_event(&f, m.get(), written));
  kvt_xfer *x = nullptr;
  ASSERT_KVT_OK(kvt_xfer_offload(&x, m.get(), &reg, 1, KVT_TIER_G2, f, 0));
  EXPECT_KVT(kvt_xfer_wait(x, 200'000'000), KVT_TIMEOUT);
  uint32_t state = 0;
  ASSERT_KVT_OK(kvt_xfer_status(&state, nullptr, nullptr, x));
  EXPECT_EQ(state, uint32_t(KVT_XFER_WAITING));
  gate.open = true;
  ASSERT_KVT_OK(kvt_xfer_wait(x, 10'000'000'000));
  kvt_xfer_release(x);
  kvt_fence_destroy(f);

  std::vector<kvt_block> g2(1);
  std::vector<uint64_t> h = {42};
  size_t n = 0;
  ASSERT_KVT_OK(kvt_tier_match_prefix(&n, g2.data(), m.get(), KVT_TIER_G2, h.data(), 1));
  ASSERT_EQ(n, 1u);
  EXPECT_EQ(read_g2(m.get(), g2[0]), fresh);
  kvt_block_release(m.get(), g2.data(), 1);
  kvt_block_release(m.get(), &reg, 1);
  ASSERT_CUDA(cudaStreamSynchronize(stream));
  cudaEventDestroy(written);
  cudaStreamDestroy(stream);
  cudaFreeHost(pinned);
  EXPECT_KVT(kvt_manager_check(m.get()), KVT_OK);
}

// An engine layout that claims more device memory than it has is refused at create, with the
// region named, rather than copied out of bounds later.
TEST(Cuda, AnEngineLayoutBeyondItsDeviceMemoryIsRefused) {
  REQUIRE_GPU();
  const Geometry g{1, 2, 1 << 20};
  EngineCache cache(2, 2, g.chunk);  // room for 2 blocks
  kvt_manager_config c = cuda_config(g, 64, 4, 0, nullptr);
  c.g1_layout = &cache.layout;
  kvt_manager *m = nullptr;
  EXPECT_KVT(kvt_manager_create(&m, &c), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kvt_last_error()).find("g1_layout->bases[0]"), std::string::npos)
      << kvt_last_error();
  c.g1_blocks = 2;
  ASSERT_KVT_OK(kvt_manager_create(&m, &c));
  kvt_manager_destroy(m);
}

namespace {
// Big blocks, so that copies are still in flight when the test acts: 16 x 2 x 1 MiB.
const Geometry kBig{16, 2, 1 << 20};
constexpr size_t kBigBlocks = 48;

// kBigBlocks registered blocks in G1 (library-owned device memory), block i filled with
// byte i, and the bytes each should hold.
std::vector<kvt_block> fill_big(kvt_manager *m, std::vector<uint64_t> *hashes) {
  auto g1 = alloc(m, kBigBlocks);
  for (size_t i = 0; i < kBigBlocks; ++i) {
    write_g1(m, g1[i], kBig, Bytes(kBig.block_bytes(), uint8_t(i)));
    hashes->push_back(1000 + i);
  }
  std::vector<kvt_block> reg(kBigBlocks);
  EXPECT_EQ(kvt_block_register_hashes(reg.data(), m, g1.data(), hashes->data(), kBigBlocks, 0),
            KVT_OK);
  return reg;
}
}  // namespace

// Cancel every transfer while the first batches are crossing PCIe: each ends exactly once,
// as DONE or CANCELLED; what reached G2 is byte-exact and registered; nothing else is.
TEST(Cuda, CancellingWhileCopiesAreInFlightEndsEachTransferOnceAndKeepsG2Exact) {
  REQUIRE_GPU();
  TempDir dir;
  kvt_manager_config c = cuda_config(kBig, kBigBlocks, kBigBlocks, 0, dir.path.c_str());
  c.max_batch_size = 4;
  auto m = make(c);
  ASSERT_TRUE(m);
  std::vector<uint64_t> h;
  auto reg = fill_big(m.get(), &h);
  std::vector<kvt_xfer *> xs;
  for (size_t i = 0; i < kBigBlocks; i += 4) {
    kvt_xfer *x = nullptr;
    ASSERT_KVT_OK(kvt_xfer_offload(&x, m.get(), reg.data() + i, 4, KVT_TIER_G2, nullptr, i + 1));
    xs.push_back(x);
  }
  for (kvt_xfer *x : xs) ASSERT_KVT_OK(kvt_xfer_cancel(x));
  size_t done = 0, cancelled = 0;
  uint64_t moved = 0;
  for (kvt_xfer *x : xs) {
    kvt_status s = kvt_xfer_wait(x, -1);
    ASSERT_TRUE(s == KVT_OK || s == KVT_ERR_CANCELLED) << kvt_status_str(s);
    uint64_t count = 0;
    ASSERT_KVT_OK(kvt_xfer_status(nullptr, nullptr, &count, x));
    ++(s == KVT_OK ? done : cancelled);
    if (s == KVT_OK) moved += count;
  }
  std::vector<kvt_event> ev(4096);
  std::map<uint64_t, int> ends;
  for (size_t k; (k = kvt_manager_poll(m.get(), ev.data(), ev.size())) > 0;)
    for (size_t i = 0; i < k; ++i)
      if (ev[i].type == KVT_EVENT_XFER_DONE) ++ends[ev[i].user_data];
  EXPECT_EQ(ends.size(), xs.size());
  for (auto [ud, k] : ends) EXPECT_EQ(k, 1) << "transfer " << ud;
  EXPECT_GT(cancelled, 0u) << "every batch finished before the cancel: nothing was tested";
  EXPECT_EQ(stats(m.get(), KVT_TIER_G2).registered, moved);
  for (size_t i = 0; i < kBigBlocks; ++i) {
    kvt_block b = 0;
    std::vector<kvt_block> one(1);
    size_t n = 0;
    ASSERT_KVT_OK(kvt_tier_match_prefix(&n, one.data(), m.get(), KVT_TIER_G2, &h[i], 1));
    if (n == 0) continue;
    b = one[0];
    EXPECT_EQ(read_g2(m.get(), b), Bytes(kBig.block_bytes(), uint8_t(i))) << "block " << i;
    kvt_block_release(m.get(), &b, 1);
  }
  for (kvt_xfer *x : xs) kvt_xfer_release(x);
  kvt_block_release(m.get(), reg.data(), kBigBlocks);
  EXPECT_KVT(kvt_manager_check(m.get()), KVT_OK);
}

// Destroy the manager while offloads and onboards are queued and copying: it waits for the
// copies, frees its device memory, and leaves no CUDA error behind; the engine may then free
// the G1 tensors that the onboards were writing.
TEST(Cuda, DestroyWithCopiesPendingWaitsForThemAndFreesTheDevice) {
  REQUIRE_GPU();
  size_t free_before = 0, total = 0;
  ASSERT_CUDA(cudaMemGetInfo(&free_before, &total));
  for (bool engine_owned : {false, true}) {
    TempDir dir;
    auto cache = std::make_unique<EngineCache>(kBig.layers * kBig.outer, kBigBlocks * 2,
                                               kBig.chunk);
    kvt_manager_config c = cuda_config(kBig, kBigBlocks * 2, kBigBlocks, 0, dir.path.c_str());
    c.max_batch_size = 4;
    c.cuda_copy = engine_owned ? KVT_CUDA_COPY_KERNEL : KVT_CUDA_COPY_BATCHED;
    if (engine_owned) c.g1_layout = &cache->layout;
    kvt_manager *m = nullptr;
    ASSERT_KVT_OK(kvt_manager_create(&m, &c));
    std::vector<uint64_t> h;
    auto reg = fill_big(m, &h);
    kvt_xfer *x = nullptr;
    ASSERT_KVT_OK(kvt_xfer_offload(&x, m, reg.data(), kBigBlocks, KVT_TIER_G2, nullptr, 0));
    ASSERT_KVT_OK(kvt_xfer_wait(x, -1));
    kvt_xfer_release(x);
    std::vector<kvt_block> src(kBigBlocks);
    size_t n = 0;
    ASSERT_KVT_OK(kvt_tier_match_prefix(&n, src.data(), m, KVT_TIER_G2, h.data(), kBigBlocks));
    ASSERT_EQ(n, kBigBlocks);
    auto dst = alloc(m, kBigBlocks);
    kvt_xfer *on = nullptr, *off = nullptr;
    ASSERT_KVT_OK(kvt_xfer_onboard(&on, m, src.data(), dst.data(), kBigBlocks, nullptr, 0));
    ASSERT_KVT_OK(kvt_xfer_offload(&off, m, reg.data(), kBigBlocks, KVT_TIER_G2, nullptr, 0));
    kvt_manager_destroy(m);  // the transfers and handles die with it
    EXPECT_KVT(kvt_xfer_wait(on, 0), KVT_ERR_INVALID_HANDLE);
    cache.reset();
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  }
  size_t free_after = 0;
  ASSERT_CUDA(cudaMemGetInfo(&free_after, &total));
  // Freed device memory may stay in the driver's pools for a while; a leak of one G1 is
  // over 1.5 GiB here, far above that slack.
  EXPECT_GT(free_after + (256u << 20), free_before)
      << "device memory not returned: " << (free_before - free_after) << " bytes";
}
