// Versioned structs: a program built against the 0.1.0 header passes structs cut at their
// 0.1.0 size. The library reads them with defaults for what they lack, fills them only up to
// their size, and refuses sizes outside [0.1.0 size, its own size] or off the 8-byte steps.
// Every struct below lives in a heap buffer of exactly the caller's size, so that ASan
// reports any byte the library touches past it.
#include <dlfcn.h>

#include <cstddef>
#include <cstring>
#include <memory>
#include <string>

#include "support.hpp"

using namespace kvt_test;

namespace {

// Sizes of the structs in kvtier 0.1.0, the first published header: each ends at the field
// named here.
constexpr size_t kConfig01 = offsetof(kvt_manager_config, cuda_copy) + sizeof(uint32_t);
constexpr size_t kLayout01 = offsetof(kvt_g1_layout, strides) + sizeof(void *);
constexpr size_t kTierStats01 = offsetof(kvt_tier_stats, match_hit) + sizeof(uint64_t);
constexpr size_t kXferStats01 = offsetof(kvt_transfer_stats, busy_ns) + sizeof(uint64_t);
constexpr size_t kBlockInfo01 = offsetof(kvt_block_info, parent_hash) + sizeof(uint64_t);
static_assert(kConfig01 == 152 && kLayout01 == 32 && kTierStats01 == 112 &&
              kXferStats01 == 56 && kBlockInfo01 == 40);

// n bytes of heap holding a T's first n bytes; ASan watches the end.
template <class T>
struct Cut {
  explicit Cut(size_t n, unsigned char fill = 0xA5) : size(n), bytes(new unsigned char[n]) {
    std::memset(bytes.get(), fill, n);
  }
  T *get() { return reinterpret_cast<T *>(bytes.get()); }
  size_t size;
  std::unique_ptr<unsigned char[]> bytes;
};

bool mentions(const char *text) { return std::strstr(kvt_last_error(), text) != nullptr; }

kvt_manager_config config_for_tests() {
  kvt_manager_config c = small_config(4, 4);
  c.copy_threads = 1;
  return c;
}

}  // namespace

TEST(AbiVersioned, InitSizedWritesTheDefaultsUpToTheGivenSizeAndNoFurther) {
  kvt_manager_config full;
  kvt_manager_config_init(&full);
  EXPECT_EQ(full.struct_size, sizeof full);
  Cut<kvt_manager_config> cut(kConfig01);
  kvt_manager_config_init_sized(cut.get(), kConfig01);
  EXPECT_EQ(cut.get()->struct_size, kConfig01);
  EXPECT_EQ(std::memcmp(reinterpret_cast<char *>(cut.get()) + 4,
                        reinterpret_cast<char *>(&full) + 4, kConfig01 - 4),
            0);
  // The same in a larger buffer: the bytes past the size keep what they held.
  Cut<kvt_manager_config> roomy(sizeof(kvt_manager_config) + 64, 0x5A);
  kvt_manager_config_init_sized(roomy.get(), kConfig01);
  for (size_t i = kConfig01; i < roomy.size; ++i) ASSERT_EQ(roomy.bytes[i], 0x5A) << i;
  kvt_manager_config_init_sized(nullptr, sizeof full);  // ignored
}

// A binary built against the 0.1.0 header calls the exported kvt_manager_config_init (the
// header now inlines one of that name), on a struct of 0.1.0's size.
TEST(AbiVersioned, TheExportedInitOf010WritesOnlyA010Struct) {
  using Init = void (*)(kvt_manager_config *);
  auto init = reinterpret_cast<Init>(dlsym(RTLD_DEFAULT, "kvt_manager_config_init"));
  ASSERT_NE(init, nullptr) << "0.1.0's kvt_manager_config_init is not exported";
  Cut<kvt_manager_config> cut(kConfig01);
  init(cut.get());
  EXPECT_EQ(cut.get()->struct_size, kConfig01);
  cut.get()->g1_blocks = 4;
  cut.get()->g2_blocks = 4;
  kvt_manager *m = nullptr;
  EXPECT_KVT(kvt_manager_create(&m, cut.get()), KVT_OK);
  kvt_manager_destroy(m);
}

TEST(AbiVersioned, InitSizedWithASizeOutOfRangeSetsOnlyTheSizeAndCreateRefusesIt) {
  for (size_t size : {size_t{8}, kConfig01 - 8, kConfig01 + 4, sizeof(kvt_manager_config) + 8}) {
    Cut<kvt_manager_config> cut(size, 0x33);
    kvt_manager_config_init_sized(cut.get(), size);
    EXPECT_EQ(cut.get()->struct_size, size);
    for (size_t i = 4; i < size; ++i) ASSERT_EQ(cut.bytes[i], 0x33) << size << " " << i;
    kvt_manager *m = nullptr;
    EXPECT_KVT(kvt_manager_create(&m, cut.get()), KVT_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(m, nullptr);
    EXPECT_TRUE(mentions("cfg->struct_size")) << kvt_last_error();
    if (size > sizeof(kvt_manager_config)) {
      EXPECT_TRUE(mentions("newer kvtier.h")) << kvt_last_error();
    }
  }
  Cut<kvt_manager_config> tiny(2, 0x44);  // too small to hold struct_size: untouched
  kvt_manager_config_init_sized(tiny.get(), 2);
  EXPECT_EQ(tiny.bytes[0], 0x44);
  EXPECT_EQ(tiny.bytes[1], 0x44);
}

// A 0.1.0 config: what it holds is used, what it lacks takes the defaults, whatever the
// bytes after it hold.
TEST(AbiVersioned, CreateTakesAConfigCutAtTheFirstPublishedSize) {
  const kvt_manager_config want = config_for_tests();
  Cut<kvt_manager_config> cut(kConfig01);
  std::memcpy(cut.get(), &want, kConfig01);
  cut.get()->struct_size = kConfig01;
  kvt_manager *raw = nullptr;
  ASSERT_KVT_OK(kvt_manager_create(&raw, cut.get()));
  ManagerPtr m(raw);
  EXPECT_EQ(stats(m.get(), KVT_TIER_G1).capacity, 4u);
  EXPECT_EQ(stats(m.get(), KVT_TIER_G2).capacity, 4u);

  // In a full-size struct whose newer fields hold garbage, struct_size alone decides.
  kvt_manager_config garbage = want;
  std::memset(reinterpret_cast<char *>(&garbage) + kConfig01, 0xFF, sizeof garbage - kConfig01);
  garbage.struct_size = kConfig01;
  ManagerPtr m2 = make(garbage);
  EXPECT_NE(m2, nullptr);
}

TEST(AbiVersioned, CreateTakesALayoutCutAtTheFirstPublishedSize) {
  kvt_manager_config c = config_for_tests();
  c.num_layers = 1;
  c.num_outer = 1;
  std::vector<char> g1(c.g1_blocks * c.chunk_bytes);
  const void *bases[1] = {g1.data()};
  const uint64_t strides[1] = {c.chunk_bytes};
  Cut<kvt_g1_layout> lay(kLayout01);
  kvt_g1_layout l{};
  l.struct_size = kLayout01;
  l.memory = KVT_MEMORY_HOST;
  l.bases = bases;
  l.strides = strides;
  std::memcpy(lay.get(), &l, kLayout01);
  c.g1_layout = lay.get();
  ManagerPtr m = make(c);
  ASSERT_NE(m, nullptr);
  kvt_block b = alloc(m.get(), 1)[0];
  void *p = nullptr;
  size_t len = 0;
  ASSERT_KVT_OK(kvt_block_data(&p, &len, m.get(), b));
  EXPECT_GE(static_cast<char *>(p), g1.data());
  EXPECT_LT(static_cast<char *>(p), g1.data() + g1.size());

  for (uint32_t size : {uint32_t(kLayout01 - 8), uint32_t(sizeof l + 8), uint32_t(kLayout01 + 4)}) {
    lay.get()->struct_size = size;
    kvt_manager *raw = nullptr;
    EXPECT_KVT(kvt_manager_create(&raw, &c), KVT_ERR_INVALID_ARGUMENT);
    EXPECT_TRUE(mentions("cfg->g1_layout->struct_size")) << kvt_last_error();
  }
}

// Stats and block info cut at their 0.1.0 size: filled up to it, with the same values as a
// full-size call, and not a byte further.
TEST(AbiVersioned, OutputStructsAreFilledUpToTheCallersSize) {
  ManagerPtr m = make(config_for_tests());
  std::vector<kvt_block> b = store(m.get(), {7, 8});

  kvt_tier_stats full_ts = stats(m.get(), KVT_TIER_G1);
  Cut<kvt_tier_stats> ts(kTierStats01);
  ts.get()->struct_size = kTierStats01;
  ASSERT_KVT_OK(kvt_tier_stats_get(ts.get(), m.get(), KVT_TIER_G1));
  EXPECT_EQ(ts.get()->struct_size, kTierStats01);  // the caller's, not the library's
  EXPECT_EQ(std::memcmp(ts.bytes.get() + 4, reinterpret_cast<char *>(&full_ts) + 4,
                        kTierStats01 - 4),
            0);
  EXPECT_EQ(ts.get()->registered, 2u);

  kvt_transfer_stats full_xs{};
  full_xs.struct_size = sizeof full_xs;
  ASSERT_KVT_OK(kvt_transfer_stats_get(&full_xs, m.get(), KVT_TIER_G1, KVT_TIER_G2));
  Cut<kvt_transfer_stats> xs(kXferStats01);
  xs.get()->struct_size = kXferStats01;
  ASSERT_KVT_OK(kvt_transfer_stats_get(xs.get(), m.get(), KVT_TIER_G1, KVT_TIER_G2));
  EXPECT_EQ(std::memcmp(xs.bytes.get() + 4, reinterpret_cast<char *>(&full_xs) + 4,
                        kXferStats01 - 4),
            0);

  kvt_block_info full_bi = info(m.get(), b[1]);
  Cut<kvt_block_info> bi(kBlockInfo01);
  bi.get()->struct_size = kBlockInfo01;
  ASSERT_KVT_OK(kvt_block_info_get(bi.get(), m.get(), b[1]));
  EXPECT_EQ(std::memcmp(bi.bytes.get() + 4, reinterpret_cast<char *>(&full_bi) + 4,
                        kBlockInfo01 - 4),
            0);
  EXPECT_EQ(bi.get()->seq_hash, 8u);
  EXPECT_EQ(bi.get()->parent_hash, 7u);

  // A 0.1.0 size inside a larger buffer: the tail keeps its bytes.
  Cut<kvt_tier_stats> roomy(sizeof(kvt_tier_stats) + 16, 0x77);
  roomy.get()->struct_size = kTierStats01;
  ASSERT_KVT_OK(kvt_tier_stats_get(roomy.get(), m.get(), KVT_TIER_G1));
  for (size_t i = kTierStats01; i < roomy.size; ++i) ASSERT_EQ(roomy.bytes[i], 0x77) << i;
  ASSERT_KVT_OK(kvt_block_release(m.get(), b.data(), b.size()));
}

// Sizes below the first, above the library's or off the steps are refused with a message,
// and the struct is left as it was.
TEST(AbiVersioned, OutputStructsOfOtherSizesAreRefusedUntouched) {
  ManagerPtr m = make(config_for_tests());
  kvt_block b = alloc(m.get(), 1)[0];
  auto refused = [](auto *out, size_t size, auto call) {
    using T = std::remove_pointer_t<decltype(out)>;
    std::memset(static_cast<void *>(out), 0x66, sizeof(T));
    out->struct_size = uint32_t(size);
    T before;
    std::memcpy(static_cast<void *>(&before), out, sizeof(T));
    EXPECT_KVT(call(), KVT_ERR_INVALID_ARGUMENT);
    EXPECT_TRUE(mentions("out->struct_size")) << kvt_last_error();
    EXPECT_EQ(std::memcmp(&before, out, sizeof(T)), 0) << size;
  };
  struct {
    kvt_tier_stats ts;
    kvt_transfer_stats xs;
    kvt_block_info bi;
  } s;
  for (size_t size : {size_t{0}, kTierStats01 - 8, kTierStats01 + 4, sizeof s.ts + 8})
    refused(&s.ts, size, [&] { return kvt_tier_stats_get(&s.ts, m.get(), KVT_TIER_G1); });
  for (size_t size : {size_t{8}, kXferStats01 - 8, sizeof s.xs + 8})
    refused(&s.xs, size,
            [&] { return kvt_transfer_stats_get(&s.xs, m.get(), KVT_TIER_G2, KVT_TIER_G1); });
  for (size_t size : {size_t{3}, kBlockInfo01 - 8, kBlockInfo01 + 4, sizeof s.bi + 8})
    refused(&s.bi, size, [&] { return kvt_block_info_get(&s.bi, m.get(), b); });
  ASSERT_KVT_OK(kvt_block_release(m.get(), &b, 1));
}
