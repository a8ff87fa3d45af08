// bench_cuda_copy: N blocks scattered over a vLLM-style G1 on the GPU, copied to and from
// kvtier's G2 layout in pinned host memory (D2H and H2D), by each method below, each beside
// one contiguous cudaMemcpyAsync of the same total bytes in the same run, the physical
// reference:
//   batched    one cudaMemcpyBatchAsync of every chunk (KVT_CUDA_COPY_BATCHED);
//   per_chunk  one cudaMemcpyAsync per chunk (KVT_CUDA_COPY_PER_CHUNK);
//   kernel     a gather/scatter kernel that reads or writes the pinned host memory through
//              its mapped address, one thread block per chunk, given the block ids;
//   kvtier     kvt_xfer_offload G1 -> G2 and kvt_xfer_onboard G2 -> G1 through the library (engine
//              layout over the same tensors, the library's default copy method), enqueue to
//              end of wait; the first copy each way is checked word by word.
// G1 is 32 layers x {K, V}: 64 device tensors of `pool` blocks each; a block is one chunk in
// each. The N blocks are drawn at random from a pool of 2N, as an engine's free list
// scatters them, and land in G2 slots in another random order. Times are host wall clock
// from the first enqueue to the end of cudaStreamSynchronize (so the cost of building the
// copy lists and launching counts), median of the repetitions.
//   bench_cuda_copy [--quick] [--kvtier-only] [--phases]    prints a markdown table; JSON
//   lines with KVT_BENCH_JSON=file. --kvtier-only times the contiguous copy and the library
//   alone, to compare two builds of the library (LD_LIBRARY_PATH) with the same binary.
//   --phases splits the library's offload (D2H) at 1-64 blocks into the times at which the
//   caller, polling kvt_xfer_status, first saw each state (microseconds, medians).
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kvtier.h"

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kRegions = 64;  // 32 layers x {K, V}

void check(cudaError_t e, const char *what) {
  if (e == cudaSuccess) return;
  std::fprintf(stderr, "bench_cuda_copy: %s: %s\n", what, cudaGetErrorString(e));
  std::exit(1);
}
#define CK(x) check((x), #x)

__device__ __host__ inline uint64_t word_of(uint64_t region, uint64_t block, uint64_t i) {
  uint64_t x = (region << 40) ^ (block << 20) ^ i;
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  return x ^ (x >> 29);
}

struct Tables {
  char *const *bases;    // device: kRegions tensor bases
  const uint32_t *ids;   // device: the N G1 block ids
  const uint32_t *slots; // device: the N G2 slots
};

// Block (x = region, y = i): G1 chunk (region, ids[i]) <-> G2 bytes of slot slots[i] at
// region * chunk. Four 16-byte loads in flight per thread before the stores, so that reads
// of host memory over PCIe overlap.
template <bool kToHost>
__global__ void copy_chunks(Tables t, char *host, uint64_t chunk, uint64_t block_bytes) {
  const uint32_t r = blockIdx.x, i = blockIdx.y;
  char *dev = t.bases[r] + uint64_t(t.ids[i]) * chunk;
  char *hst = host + uint64_t(t.slots[i]) * block_bytes + uint64_t(r) * chunk;
  const int4 *src = reinterpret_cast<const int4 *>(kToHost ? dev : hst);
  int4 *dst = reinterpret_cast<int4 *>(kToHost ? hst : dev);
  const uint64_t n = chunk / 16, step = blockDim.x;
  uint64_t k = threadIdx.x;
  for (; k + 3 * step < n; k += 4 * step) {
    int4 a = src[k], b = src[k + step], c = src[k + 2 * step], d = src[k + 3 * step];
    dst[k] = a;
    dst[k + step] = b;
    dst[k + 2 * step] = c;
    dst[k + 3 * step] = d;
  }
  for (; k < n; k += step) dst[k] = src[k];
}

// Chunk (region r, slot) of G1 gets the words of its (r, slot), one thread block's share.
__device__ void fill_chunk(char *const *bases, uint32_t r, uint64_t slot, uint64_t chunk) {
  auto *w = reinterpret_cast<uint64_t *>(bases[r] + slot * chunk);
  for (uint64_t k = threadIdx.x; k < chunk / 8; k += blockDim.x) w[k] = word_of(r, slot, k);
}

__global__ void fill_chunks(Tables t, uint32_t n_ids, uint64_t chunk) {
  if (blockIdx.y < n_ids) fill_chunk(t.bases, blockIdx.x, t.ids[blockIdx.y], chunk);
}

// Every slot of every region (grid: regions x slots), wherever the library puts a block.
__global__ void fill_slots(char *const *bases, uint64_t chunk) {
  fill_chunk(bases, blockIdx.x, blockIdx.y, chunk);
}

__global__ void count_wrong(Tables t, uint64_t chunk, unsigned long long *wrong) {
  const uint32_t r = blockIdx.x, i = blockIdx.y;
  auto *w = reinterpret_cast<const uint64_t *>(t.bases[r] + uint64_t(t.ids[i]) * chunk);
  unsigned long long bad = 0;
  for (uint64_t k = threadIdx.x; k < chunk / 8; k += blockDim.x)
    bad += w[k] != word_of(r, t.ids[i], k);
  if (bad) atomicAdd(wrong, bad);
}

struct Case {
  uint64_t chunk;
  uint32_t n;
};

struct Row {
  Case c;
  const char *dir, *method;
  double seconds, ref_seconds;
  uint64_t wrong;  // words that did not arrive as written, for the checked methods
};

// --phases: where a library offload's time goes, seen from the caller. Each round trip
// polls kvt_xfer_status instead of waiting, and notes when it first saw each state; the
// medians are in microseconds from the start of kvt_xfer_offload.
struct Phases {
  double ref_us, kernel_us, wait_us;   // contiguous copy, bare kernel, offload + wait
  double call_us, eval_us, batched_us, inflight_us, done_us;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

class Bench {
 public:
  Bench(Case c, int reps) : c_(c), reps_(reps) {
    n_ = c.n;
    pool_ = 2 * n_;
    block_ = uint64_t(kRegions) * c.chunk;
    bytes_ = uint64_t(n_) * block_;
    std::mt19937 rng(c.n * 31 + uint32_t(c.chunk >> 10));
    std::vector<uint32_t> all(pool_);
    for (uint32_t i = 0; i < pool_; ++i) all[i] = i;
    std::shuffle(all.begin(), all.end(), rng);
    ids_.assign(all.begin(), all.begin() + n_);
    slots_.resize(n_);
    for (uint32_t i = 0; i < n_; ++i) slots_[i] = i;
    std::shuffle(slots_.begin(), slots_.end(), rng);
    for (int r = 0; r < kRegions; ++r) {
      char *p = nullptr;
      CK(cudaMalloc(&p, uint64_t(pool_) * c.chunk));
      regions_.push_back(p);
    }
    CK(cudaMalloc(&dev_contig_, bytes_));
    CK(cudaHostAlloc(&host_, bytes_, cudaHostAllocMapped | cudaHostAllocPortable));
    CK(cudaMalloc(&d_bases_, sizeof(char *) * kRegions));
    CK(cudaMemcpy(d_bases_, regions_.data(), sizeof(char *) * kRegions, cudaMemcpyHostToDevice));
    CK(cudaMalloc(&d_ids_, sizeof(uint32_t) * n_));
    CK(cudaMalloc(&d_slots_, sizeof(uint32_t) * n_));
    CK(cudaMallocHost(&h_ids_, sizeof(uint32_t) * n_ * 2));
    CK(cudaMalloc(&d_wrong_, sizeof(unsigned long long)));
    CK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking));
    tables_ = {d_bases_, d_ids_, d_slots_};
    CK(cudaMemcpy(d_ids_, ids_.data(), sizeof(uint32_t) * n_, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_slots_, slots_.data(), sizeof(uint32_t) * n_, cudaMemcpyHostToDevice));
    // The copy lists as an engine would hand them over: G1 chunk and G2 address per chunk.
    for (uint32_t i = 0; i < n_; ++i)
      for (int r = 0; r < kRegions; ++r) {
        dev_.push_back(regions_[r] + uint64_t(ids_[i]) * c.chunk);
        hst_.push_back(host_ + uint64_t(slots_[i]) * block_ + uint64_t(r) * c.chunk);
      }
    CK(cudaMemset(dev_contig_, 1, bytes_));
  }
  ~Bench() {
    for (char *p : regions_) cudaFree(p);
    cudaFree(dev_contig_);
    cudaFreeHost(host_);
    cudaFree(d_bases_);
    cudaFree(d_ids_);
    cudaFree(d_slots_);
    cudaFreeHost(h_ids_);
    cudaFree(d_wrong_);
    cudaStreamDestroy(s_);
  }

  void run(std::vector<Row> *rows, bool kvtier_only) {
    for (bool to_host : {true, false}) {
      const char *dir = to_host ? "D2H" : "H2D";
      const double ref = time([&] { contiguous(to_host); });
      for (const char *m : {"batched", "per_chunk", "kernel"}) {
        if (kvtier_only) break;
        const std::string name = m;
        prepare(to_host);
        auto op = [&] {
          if (name == "batched") batched(to_host);
          else if (name == "per_chunk") per_chunk(to_host);
          else kernel(to_host);
        };
        op();
        CK(cudaStreamSynchronize(s_));
        const uint64_t wrong = verify(to_host);
        rows->push_back({c_, dir, m, time(op), ref, wrong});
      }
      uint64_t wrong = 0;
      const double t = through_kvtier(to_host, &wrong);
      rows->push_back({c_, dir, "kvtier", t, ref, wrong});
    }
  }

  // D2H only: the contiguous copy, the bare kernel, the library's offload + wait, and the
  // library's offload polled through its states.
  Phases phases() {
    Phases ph{};
    ph.ref_us = 1e6 * time([&] { contiguous(true); });
    ph.kernel_us = 1e6 * time([&] { kernel(true); });
    uint64_t wrong = 0;
    ph.wait_us = 1e6 * through_kvtier(true, &wrong, &ph);
    if (wrong != 0) {
      std::fprintf(stderr, "bench_cuda_copy: --phases: %llu wrong words\n", (unsigned long long)wrong);
      std::exit(1);
    }
    return ph;
  }

 private:
  template <class F>
  double time(F op) {
    for (int i = 0; i < 2; ++i) op();
    CK(cudaStreamSynchronize(s_));
    std::vector<double> t;
    for (int i = 0; i < reps_; ++i) {
      auto t0 = Clock::now();
      op();
      CK(cudaStreamSynchronize(s_));
      t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
    return median(t);
  }

  void contiguous(bool to_host) {
    CK(to_host ? cudaMemcpyAsync(host_, dev_contig_, bytes_, cudaMemcpyDeviceToHost, s_)
               : cudaMemcpyAsync(dev_contig_, host_, bytes_, cudaMemcpyHostToDevice, s_));
  }
  void batched(bool to_host) {
    std::vector<void *> dsts;
    std::vector<const void *> srcs;
    std::vector<size_t> sizes(dev_.size(), c_.chunk);
    dsts.reserve(dev_.size());
    srcs.reserve(dev_.size());
    for (size_t k = 0; k < dev_.size(); ++k) {
      dsts.push_back(to_host ? hst_[k] : dev_[k]);
      srcs.push_back(to_host ? dev_[k] : hst_[k]);
    }
    cudaMemcpyAttributes attr{};
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    size_t idx = 0;
    CK(cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), dsts.size(), &attr, &idx, 1,
                            s_));
  }
  void per_chunk(bool to_host) {
    for (size_t k = 0; k < dev_.size(); ++k)
      CK(to_host ? cudaMemcpyAsync(hst_[k], dev_[k], c_.chunk, cudaMemcpyDeviceToHost, s_)
                 : cudaMemcpyAsync(dev_[k], hst_[k], c_.chunk, cudaMemcpyHostToDevice, s_));
  }
  // The ids and slots travel with each call, as they would for an engine's step.
  void kernel(bool to_host) {
    std::memcpy(h_ids_, ids_.data(), sizeof(uint32_t) * n_);
    std::memcpy(h_ids_ + n_, slots_.data(), sizeof(uint32_t) * n_);
    CK(cudaMemcpyAsync(d_ids_, h_ids_, sizeof(uint32_t) * n_, cudaMemcpyHostToDevice, s_));
    CK(cudaMemcpyAsync(d_slots_, h_ids_ + n_, sizeof(uint32_t) * n_, cudaMemcpyHostToDevice, s_));
    const dim3 grid(kRegions, n_);
    const unsigned threads = c_.chunk >= (64u << 10) ? 1024 : 256;
    if (to_host)
      copy_chunks<true><<<grid, threads, 0, s_>>>(tables_, host_, c_.chunk, block_);
    else
      copy_chunks<false><<<grid, threads, 0, s_>>>(tables_, host_, c_.chunk, block_);
    CK(cudaGetLastError());
  }

  // Before a checked run: D2H writes known words on the device and poisons G2; H2D writes
  // the known words into G2 and poisons the device chunks.
  void prepare(bool to_host) {
    const dim3 grid(kRegions, n_);
    fill_chunks<<<grid, 256, 0, s_>>>(tables_, n_, c_.chunk);
    CK(cudaGetLastError());
    CK(cudaStreamSynchronize(s_));
    if (to_host) {
      std::memset(host_, 0xA5, bytes_);
      return;
    }
    batched(true);
    CK(cudaStreamSynchronize(s_));
    for (char *p : regions_) CK(cudaMemset(p, 0, uint64_t(pool_) * c_.chunk));
    CK(cudaDeviceSynchronize());
  }
  uint64_t verify(bool to_host) {
    if (!to_host) {
      CK(cudaMemset(d_wrong_, 0, sizeof(unsigned long long)));
      count_wrong<<<dim3(kRegions, n_), 256, 0, s_>>>(tables_, c_.chunk, d_wrong_);
      CK(cudaGetLastError());
      unsigned long long wrong = 0;
      CK(cudaMemcpy(&wrong, d_wrong_, sizeof wrong, cudaMemcpyDeviceToHost));
      return wrong;
    }
    uint64_t wrong = 0;
    for (uint32_t i = 0; i < n_; ++i)
      for (int r = 0; r < kRegions; ++r) {
        auto *w = reinterpret_cast<const uint64_t *>(host_ + uint64_t(slots_[i]) * block_ +
                                                     uint64_t(r) * c_.chunk);
        for (uint64_t k = 0; k < c_.chunk / 8; ++k) wrong += w[k] != word_of(r, ids_[i], k);
      }
    return wrong;
  }

  // The library over the same tensors: offload of N registered G1 blocks to G2 (D2H), or
  // onboard of N G2 blocks into G1 (H2D), timed from enqueue to the end of the wait. The
  // first (warm-up) copy is checked: *wrong counts the words that did not arrive.
  double through_kvtier(bool to_host, uint64_t *wrong, Phases *ph = nullptr) {
    std::vector<double> calls, polled[KVT_XFER_FAILED + 1];
    fill_slots<<<dim3(kRegions, pool_), 256, 0, s_>>>(d_bases_, c_.chunk);
    CK(cudaGetLastError());
    CK(cudaStreamSynchronize(s_));
    std::vector<const void *> bases(regions_.begin(), regions_.end());
    std::vector<uint64_t> strides(kRegions, c_.chunk);
    kvt_g1_layout lay{};
    lay.struct_size = sizeof lay;
    lay.memory = KVT_MEMORY_CUDA;
    lay.bases = bases.data();
    lay.strides = strides.data();
    kvt_manager_config cfg;
    kvt_manager_config_init(&cfg);
    cfg.num_layers = kRegions / 2;
    cfg.num_outer = 2;
    cfg.chunk_bytes = c_.chunk;
    cfg.g1_blocks = pool_;
    cfg.g2_blocks = n_;
    cfg.g3_blocks = 0;
    cfg.g1_layout = &lay;
    cfg.max_batch_size = std::max<uint32_t>(n_, 1);
    cfg.min_batch_size = 1;
    cfg.policy_g1_g2 = {KVT_POLICY_PASS_ALL, 0};
    kvt_manager *m = nullptr;
    if (kvt_manager_create(&m, &cfg) != KVT_OK) {
      std::fprintf(stderr, "bench_cuda_copy: kvt_manager_create: %s\n", kvt_last_error());
      std::exit(1);
    }
    std::vector<kvt_block> g1(n_), b(n_);
    std::vector<uint64_t> h(n_);
    for (uint32_t i = 0; i < n_; ++i) h[i] = 1000 + i;
    kvt_block_alloc(g1.data(), n_, m, KVT_TIER_G1);
    kvt_block_register_hashes(g1.data(), m, g1.data(), h.data(), n_, 0);
    // Where the library put each block: the slot its chunks hold the words of.
    auto slot_of = [&](kvt_block b) {
      void *p = nullptr;
      kvt_block_chunk(&p, m, b, 0, 0);
      return uint64_t(static_cast<char *>(p) - regions_[0]) / c_.chunk;
    };
    std::vector<uint64_t> slot(n_);
    for (uint32_t i = 0; i < n_; ++i) slot[i] = slot_of(g1[i]);
    const uint64_t words = c_.chunk / 8;
    std::vector<uint64_t> got(words);
    auto count = [&](const uint64_t *w, int r, uint64_t s) {
      for (uint64_t k = 0; k < words; ++k) *wrong += w[k] != word_of(r, s, k);
    };
    std::vector<kvt_event> ev(4096);
    auto drain = [&] {
      while (kvt_manager_poll(m, ev.data(), ev.size()) > 0) {
      }
    };
    auto must = [](kvt_status s, const char *what) {
      if (s == KVT_OK) return;
      std::fprintf(stderr, "bench_cuda_copy: %s: %s\n", what, kvt_last_error());
      std::exit(1);
    };
    std::vector<double> t;
    // Evicts the copies from G2, so that the next offload copies again.
    auto evict_g2 = [&] {
      kvt_block_alloc(b.data(), n_, m, KVT_TIER_G2);
      kvt_block_release(m, b.data(), n_);
      drain();
    };
    if (to_host) {
      for (int i = 0; i < reps_ + 2; ++i) {
        kvt_xfer *x = nullptr;
        auto t0 = Clock::now();
        must(kvt_xfer_offload(&x, m, g1.data(), n_, KVT_TIER_G2, nullptr, 0), "kvt_xfer_offload");
        must(kvt_xfer_wait(x, -1), "offload");
        t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
        kvt_xfer_release(x);
        if (i == 0) {  // the G2 copies against the words of their G1 slots
          size_t found = 0;
          kvt_tier_match_prefix(&found, b.data(), m, KVT_TIER_G2, h.data(), n_);
          *wrong += (n_ - found) * kRegions * words;
          for (size_t k = 0; k < found; ++k) {
            void *p = nullptr;
            size_t len = 0;
            must(kvt_block_data(&p, &len, m, b[k]), "kvt_block_data");
            for (int r = 0; r < kRegions; ++r)
              count(reinterpret_cast<const uint64_t *>(static_cast<char *>(p) + r * c_.chunk), r,
                    slot[k]);
          }
          kvt_block_release(m, b.data(), found);
        }
        evict_g2();
      }
      for (int i = 0; ph != nullptr && i < reps_; ++i) {
        kvt_xfer *x = nullptr;
        double seen[KVT_XFER_FAILED + 1] = {};
        auto t0 = Clock::now();
        auto us = [&] { return std::chrono::duration<double, std::micro>(Clock::now() - t0).count(); };
        must(kvt_xfer_offload(&x, m, g1.data(), n_, KVT_TIER_G2, nullptr, 0), "kvt_xfer_offload");
        calls.push_back(us());
        for (uint32_t last = 0; last < KVT_XFER_DONE;) {
          uint32_t state = 0;
          kvt_status result = KVT_OK;
          kvt_xfer_status(&state, &result, nullptr, x);
          const double now = us();
          for (uint32_t s = last + 1; s <= state && s <= KVT_XFER_FAILED; ++s) seen[s] = now;
          if (state > KVT_XFER_DONE) must(result, "polled offload");
          last = std::max(last, state);
        }
        kvt_xfer_release(x);
        for (uint32_t s : {KVT_XFER_EVALUATING, KVT_XFER_BATCHED, KVT_XFER_INFLIGHT, KVT_XFER_DONE})
          polled[s].push_back(seen[s]);
        evict_g2();
      }
      if (ph != nullptr) {
        ph->call_us = median(calls);
        ph->eval_us = median(polled[KVT_XFER_EVALUATING]);
        ph->batched_us = median(polled[KVT_XFER_BATCHED]);
        ph->inflight_us = median(polled[KVT_XFER_INFLIGHT]);
        ph->done_us = median(polled[KVT_XFER_DONE]);
      }
    } else {
      kvt_xfer *x = nullptr;
      must(kvt_xfer_offload(&x, m, g1.data(), n_, KVT_TIER_G2, nullptr, 0), "kvt_xfer_offload");
      must(kvt_xfer_wait(x, -1), "offload");
      kvt_xfer_release(x);
      kvt_block_release(m, g1.data(), n_);
      std::vector<kvt_block> src(n_);
      size_t found = 0;
      kvt_tier_match_prefix(&found, src.data(), m, KVT_TIER_G2, h.data(), n_);
      std::vector<kvt_block> every(pool_);
      for (int i = 0; i < reps_ + 2; ++i) {
        // Evict every copy G1 holds, so that the onboard copies rather than finds them.
        must(kvt_block_alloc(every.data(), pool_, m, KVT_TIER_G1), "kvt_block_alloc");
        kvt_block_release(m, every.data(), pool_);
        must(kvt_block_alloc(b.data(), n_, m, KVT_TIER_G1), "kvt_block_alloc");
        if (i == 0) {  // the first onboard must bring every word
          for (char *p : regions_) CK(cudaMemset(p, 0, uint64_t(pool_) * c_.chunk));
          CK(cudaDeviceSynchronize());  // the library's streams do not wait for the default one
        }
        auto t0 = Clock::now();
        must(kvt_xfer_onboard(&x, m, src.data(), b.data(), n_, nullptr, 0), "kvt_xfer_onboard");
        must(kvt_xfer_wait(x, -1), "onboard");
        t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
        kvt_xfer_blocks(b.data(), n_, x);
        kvt_xfer_release(x);
        for (uint32_t k = 0; i == 0 && k < n_; ++k)
          for (int r = 0; r < kRegions; ++r) {
            void *p = nullptr;
            must(kvt_block_chunk(&p, m, b[k], uint32_t(r / 2), uint32_t(r % 2)), "kvt_block_chunk");
            CK(cudaMemcpy(got.data(), p, c_.chunk, cudaMemcpyDeviceToHost));
            count(got.data(), r, slot[k]);
          }
        kvt_block_release(m, b.data(), n_);
        drain();
      }
      kvt_block_release(m, src.data(), n_);
    }
    kvt_manager_destroy(m);
    t.erase(t.begin(), t.begin() + 2);  // warm-up
    return median(t);
  }

  Case c_;
  int reps_;
  uint32_t n_, pool_;
  uint64_t block_, bytes_;
  std::vector<uint32_t> ids_, slots_;
  std::vector<char *> regions_;
  std::vector<char *> dev_, hst_;
  char *dev_contig_ = nullptr, *host_ = nullptr;
  char **d_bases_ = nullptr;
  uint32_t *d_ids_ = nullptr, *d_slots_ = nullptr, *h_ids_ = nullptr;
  unsigned long long *d_wrong_ = nullptr;
  cudaStream_t s_ = nullptr;
  Tables tables_{};
};

}  // namespace

int main(int argc, char **argv) {
  bool quick = false, kvtier_only = false, phases = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      quick = true;
    } else if (std::strcmp(argv[i], "--kvtier-only") == 0) {
      kvtier_only = true;
    } else if (std::strcmp(argv[i], "--phases") == 0) {
      phases = true;
    } else {
      std::fprintf(stderr, "usage: bench_cuda_copy [--quick] [--kvtier-only] [--phases]\n");
      return 2;
    }
  }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("SKIPPED: bench_cuda_copy needs a CUDA device, and this machine has none\n");
    return 0;
  }
  cudaDeviceProp p{};
  CK(cudaGetDeviceProperties(&p, 0));
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  std::printf("device: %s, driver API %d, runtime %d\n\n", p.name, driver, runtime);
  if (phases) {
    std::printf("| chunk | blocks | contiguous | bare kernel | offload + wait | offload call "
                "| evaluating | batched | in flight | done (polled) |\n|---|---|---|---|---|---|---|---|---|---|\n");
    for (Case c : std::vector<Case>{{8 << 10, 1}, {8 << 10, 16}, {8 << 10, 64}, {64 << 10, 16}}) {
      Phases p = Bench(c, quick ? 5 : 21).phases();
      std::printf("| %llu KiB | %u | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f |\n",
                  (unsigned long long)(c.chunk >> 10), c.n, p.ref_us, p.kernel_us, p.wait_us,
                  p.call_us, p.eval_us, p.batched_us, p.inflight_us, p.done_us);
    }
    return 0;
  }
  std::vector<Case> cases;
  if (quick) {
    cases = {{8 << 10, 16}, {2 << 20, 4}};
  } else {
    for (uint32_t n : {1u, 4u, 16u, 64u, 256u, 1024u}) cases.push_back({8 << 10, n});
    for (uint32_t n : {1u, 4u, 16u, 64u, 256u}) cases.push_back({64 << 10, n});
    for (uint32_t n : {4u, 16u, 64u}) cases.push_back({2 << 20, n});
  }
  std::vector<Row> rows;
  for (Case c : cases) {
    Bench b(c, quick ? 3 : 11);
    b.run(&rows, kvtier_only);
  }
  FILE *json = std::getenv("KVT_BENCH_JSON") ? std::fopen(std::getenv("KVT_BENCH_JSON"), "w")
                                             : nullptr;
  std::printf("| chunk | blocks | MiB | dir | method | GB/s | contiguous GB/s | ratio | wrong words |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|\n");
  int bad = 0;
  for (const Row &r : rows) {
    const double bytes = double(r.c.n) * kRegions * double(r.c.chunk);
    const double gbs = bytes / r.seconds / 1e9, ref = bytes / r.ref_seconds / 1e9;
    std::printf("| %llu KiB | %u | %.0f | %s | %s | %.1f | %.1f | %.2f | %llu |\n",
                (unsigned long long)(r.c.chunk >> 10), r.c.n, bytes / (1 << 20), r.dir, r.method,
                gbs, ref, gbs / ref, (unsigned long long)r.wrong);
    if (json)
      std::fprintf(json,
                   "{\"chunk\":%llu,\"blocks\":%u,\"dir\":\"%s\",\"method\":\"%s\","
                   "\"seconds\":%.9f,\"ref_seconds\":%.9f,\"gb_per_s\":%.3f,\"ratio\":%.4f,"
                   "\"wrong\":%llu}\n",
                   (unsigned long long)r.c.chunk, r.c.n, r.dir, r.method, r.seconds,
                   r.ref_seconds, gbs, gbs / ref, (unsigned long long)r.wrong);
    bad += r.wrong != 0;
  }
  if (json) std::fclose(json);
  if (bad) std::printf("\n%d rows moved wrong bytes\n", bad);
  return bad ? 1 : 0;
}
