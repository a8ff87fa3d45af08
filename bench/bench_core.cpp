// Core-path benchmarks, each beside a baseline measured in the same run:
//   hashing         vs XXH3_64bits over the same bytes;
//   alloc+register+release and prefix match vs a naive std::unordered_map + std::list LRU.
#include <benchmark/benchmark.h>
#include <xxhash.h>

#include <list>
#include <numeric>
#include <random>
#include <unordered_map>
#include <vector>

#include "kvtier.h"

namespace {

kvt_manager *make_manager(uint64_t g1_blocks, uint32_t page = 16) {
  kvt_manager_config c;
  kvt_manager_config_init(&c);
  c.page_size = page;
  c.chunk_bytes = 0;  // metadata only: these benchmarks measure bookkeeping, not copies
  c.g1_blocks = g1_blocks;
  c.g2_blocks = 0;
  c.g1_memory = KVT_MEMORY_HOST;
  c.event_capacity = 1024;
  kvt_manager *m = nullptr;
  if (kvt_manager_create(&m, &c) != KVT_OK) std::abort();
  return m;
}

std::vector<uint32_t> random_tokens(size_t n) {
  std::vector<uint32_t> t(n);
  std::mt19937 rng(1);
  for (auto &x : t) x = rng();
  return t;
}

// ---- hashing: 256 blocks per call ----

void BM_HashSequence(benchmark::State &st) {
  const uint32_t page = uint32_t(st.range(0));
  const size_t blocks = 256;
  auto toks = random_tokens(page * blocks);
  std::vector<uint64_t> out(blocks);
  size_t n;
  for (auto _ : st) {
    kvt_hash_tokens(out.data(), blocks, &n, 0x1234, toks.data(), toks.size(), page);
    benchmark::DoNotOptimize(out.data());
  }
  st.SetItemsProcessed(st.iterations() * blocks);
  st.SetBytesProcessed(st.iterations() * toks.size() * 4);
}
BENCHMARK(BM_HashSequence)->Arg(16)->Arg(512);

// Baseline: one unseeded XXH3_64bits per block over the same bytes, no chaining.
void BM_Baseline_XXH3(benchmark::State &st) {
  const uint32_t page = uint32_t(st.range(0));
  const size_t blocks = 256;
  auto toks = random_tokens(page * blocks);
  std::vector<uint64_t> out(blocks);
  for (auto _ : st) {
    for (size_t b = 0; b < blocks; ++b) out[b] = XXH3_64bits(toks.data() + b * page, page * 4);
    benchmark::DoNotOptimize(out.data());
  }
  st.SetItemsProcessed(st.iterations() * blocks);
  st.SetBytesProcessed(st.iterations() * toks.size() * 4);
}
BENCHMARK(BM_Baseline_XXH3)->Arg(16)->Arg(512);

// ---- alloc + register + release, 64 blocks per request, never deduplicating ----

void BM_AllocRegisterRelease(benchmark::State &st) {
  kvt_manager *m = make_manager(4096);
  std::vector<kvt_block> blocks(64);
  uint64_t next_hash = 1;
  kvt_event ev[256];
  for (auto _ : st) {
    kvt_block_alloc(blocks.data(), 64, m, KVT_TIER_G1);
    uint64_t parent = 0;
    for (auto &b : blocks) {
      kvt_block_register_hash(&b, m, b, next_hash, parent);
      parent = next_hash++;
    }
    kvt_block_release(m, blocks.data(), 64);
    if ((next_hash & 4095) == 1) kvt_manager_poll(m, ev, 256);  // a host drains now and then
  }
  st.SetItemsProcessed(st.iterations() * 64);
  kvt_manager_destroy(m);
}
BENCHMARK(BM_AllocRegisterRelease);

// The same with one kvt_block_register_hashes call per request instead of one call per block.
void BM_AllocRegisterBatchRelease(benchmark::State &st) {
  kvt_manager *m = make_manager(4096);
  std::vector<kvt_block> blocks(64);
  std::vector<uint64_t> hashes(64);
  uint64_t next_hash = 1;
  kvt_event ev[256];
  for (auto _ : st) {
    kvt_block_alloc(blocks.data(), 64, m, KVT_TIER_G1);
    for (auto &h : hashes) h = next_hash++;
    kvt_block_register_hashes(blocks.data(), m, blocks.data(), hashes.data(), 64, 0);
    kvt_block_release(m, blocks.data(), 64);
    if ((next_hash & 4095) == 1) kvt_manager_poll(m, ev, 256);
  }
  st.SetItemsProcessed(st.iterations() * 64);
  kvt_manager_destroy(m);
}
BENCHMARK(BM_AllocRegisterBatchRelease);

// Baseline: the naive structure a Python-style block manager uses, in C++: an
// unordered_map registry, a free vector and a std::list LRU with an iterator map.
struct NaivePool {
  std::unordered_map<uint64_t, uint32_t> registry;
  std::vector<uint32_t> free;
  std::list<uint32_t> lru;
  std::unordered_map<uint32_t, std::list<uint32_t>::iterator> in_lru;
  std::vector<uint64_t> hash_of;
  std::vector<uint32_t> refs;
  explicit NaivePool(uint32_t cap) : hash_of(cap), refs(cap) {
    for (uint32_t i = cap; i-- > 0;) free.push_back(i);
  }
  uint32_t alloc() {
    uint32_t s;
    if (!free.empty()) {
      s = free.back();
      free.pop_back();
    } else {
      s = lru.front();
      lru.pop_front();
      in_lru.erase(s);
      registry.erase(hash_of[s]);
    }
    refs[s] = 1;
    return s;
  }
  void reg(uint32_t s, uint64_t h) {
    registry.emplace(h, s);
    hash_of[s] = h;
  }
  uint32_t match(uint64_t h) {
    auto it = registry.find(h);
    if (it == registry.end()) return UINT32_MAX;
    if (refs[it->second]++ == 0) {
      lru.erase(in_lru[it->second]);
      in_lru.erase(it->second);
    }
    return it->second;
  }
  void release(uint32_t s) {
    if (--refs[s] == 0) in_lru[s] = lru.insert(lru.end(), s);
  }
};

void BM_Baseline_NaiveAllocRegisterRelease(benchmark::State &st) {
  NaivePool p(4096);
  std::vector<uint32_t> blocks(64);
  uint64_t next_hash = 1;
  for (auto _ : st) {
    for (auto &b : blocks) b = p.alloc();
    for (auto b : blocks) p.reg(b, next_hash++);
    for (size_t i = blocks.size(); i-- > 0;) p.release(blocks[i]);
  }
  st.SetItemsProcessed(st.iterations() * 64);
}
BENCHMARK(BM_Baseline_NaiveAllocRegisterRelease);

// ---- prefix match of 64 blocks in a tier holding range(0) registered blocks ----
// "hot": the same prefix every time (a shared system prompt); "cold": a different chain
// each call, spread over the whole tier, so lookups miss the CPU caches.

std::vector<uint64_t> fill_tier(kvt_manager *m, uint64_t n) {
  std::vector<uint64_t> hashes(n);
  std::mt19937_64 rng(7);
  for (auto &h : hashes) h = rng();
  std::vector<kvt_block> b(4096);
  for (uint64_t at = 0; at < n; at += b.size()) {
    size_t k = std::min<uint64_t>(b.size(), n - at);
    kvt_block_alloc(b.data(), k, m, KVT_TIER_G1);
    for (size_t i = 0; i < k; ++i) kvt_block_register_hash(&b[i], m, b[i], hashes[at + i], 0);
    kvt_block_release(m, b.data(), k);
    kvt_event ev[1024];
    while (kvt_manager_poll(m, ev, 1024) > 0) {
    }
  }
  return hashes;
}

void match_bench(benchmark::State &st, bool cold) {
  const uint64_t n = uint64_t(st.range(0));
  kvt_manager *m = make_manager(n);
  auto hashes = fill_tier(m, n);
  std::vector<kvt_block> out(64);
  size_t chains = n / 64, c = 0, hit = 0;
  for (auto _ : st) {
    const uint64_t *q = hashes.data() + (cold ? (c = (c + 7919) % chains) * 64 : 0);
    kvt_tier_match_prefix(&hit, out.data(), m, KVT_TIER_G1, q, 64);
    benchmark::DoNotOptimize(out.data());
    st.PauseTiming();
    kvt_block_release(m, out.data(), hit);
    st.ResumeTiming();
  }
  if (hit != 64) st.SkipWithError("prefix not fully matched");
  st.SetItemsProcessed(st.iterations() * 64);
  kvt_tier_stats s{};
  s.struct_size = sizeof s;
  kvt_tier_stats_get(&s, m, KVT_TIER_G1);
  st.counters["metadata_B_per_block"] = double(s.metadata_bytes) / double(s.capacity);
  kvt_manager_destroy(m);
}
void BM_MatchPrefix64_Hot(benchmark::State &st) { match_bench(st, false); }
void BM_MatchPrefix64_Cold(benchmark::State &st) { match_bench(st, true); }
BENCHMARK(BM_MatchPrefix64_Hot)->Arg(10000)->Arg(1000000);
BENCHMARK(BM_MatchPrefix64_Cold)->Arg(10000)->Arg(1000000);

// Baseline for the cold match: what the memory system charges for the least any registry
// of slot indices must read per block: a random entry of a table as large as kvtier's
// registry (2 entries of 8 bytes per block), then the 32-byte slot that entry names. The
// 64 lookups of a call are independent of each other (the best case for overlapping misses),
// and the calls walk the tier in the same order as the cold match.
void BM_Baseline_TableThenSlot64(benchmark::State &st) {
  const uint64_t n = uint64_t(st.range(0));
  struct Entry {
    uint32_t slot, tag;
  };
  struct Slot {
    uint64_t hash, parent, links[2];
  };
  std::mt19937_64 rng(7);
  std::vector<Entry> table(2 * n);
  for (auto &e : table) e = {uint32_t(rng() % n), 1};
  std::vector<Slot> slots(n, Slot{1, 0, {0, 0}});
  std::vector<uint32_t> at(n);
  for (auto &a : at) a = uint32_t(rng() % table.size());
  size_t chains = n / 64, c = 0;
  uint64_t sum = 0;
  for (auto _ : st) {
    const uint32_t *q = at.data() + (c = (c + 7919) % chains) * 64;
    for (int i = 0; i < 64; ++i) sum += slots[table[q[i]].slot].hash;
    benchmark::DoNotOptimize(sum);
  }
  st.SetItemsProcessed(st.iterations() * 64);
}
BENCHMARK(BM_Baseline_TableThenSlot64)->Arg(10000)->Arg(1000000);

void BM_Baseline_NaiveMatch64(benchmark::State &st) {
  const uint32_t n = uint32_t(st.range(0));
  NaivePool p(n);
  std::vector<uint64_t> hashes(n);
  std::mt19937_64 rng(7);
  for (uint32_t i = 0; i < n; ++i) {
    hashes[i] = rng();
    uint32_t s = p.alloc();
    p.reg(s, hashes[i]);
    p.release(s);
  }
  std::vector<uint32_t> out(64);
  for (auto _ : st) {
    for (int i = 0; i < 64; ++i) out[i] = p.match(hashes[i]);
    st.PauseTiming();
    for (int i = 64; i-- > 0;) p.release(out[i]);
    st.ResumeTiming();
  }
  st.SetItemsProcessed(st.iterations() * 64);
}
BENCHMARK(BM_Baseline_NaiveMatch64)->Arg(10000)->Arg(1000000);

}  // namespace

BENCHMARK_MAIN();
