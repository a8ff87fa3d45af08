// Bad input to every public function: the right status, a message, and no state change.
#include <cstring>

#include "support.hpp"

using namespace kvt_test;

namespace {
// Asserts a failing call: its status, a message of its own (not the one a previous
// failure left), and an unchanged manager.
#define EXPECT_REFUSED(m, expr, want)                                              \
  do {                                                                             \
    Snapshot before_(m);                                                           \
    kvt_hash_salt(nullptr, nullptr, 0); /* leaves a known message */               \
    std::string stale_ = kvt_last_error();                                         \
    EXPECT_KVT(expr, want);                                                        \
    EXPECT_NE(stale_, kvt_last_error()) << #expr " set no message";                \
    EXPECT_TRUE(Snapshot(m) == before_) << #expr " changed the manager";           \
    EXPECT_KVT(kvt_manager_check(m), KVT_OK);                                      \
  } while (0)
}  // namespace

TEST(BadInput, LibraryFunctions) {
  EXPECT_STREQ(kvt_version(), "0.5.0");
  EXPECT_STREQ(kvt_status_str(KVT_ERR_CANCELLED), "KVT_ERR_CANCELLED");
  EXPECT_STREQ(kvt_status_str(12345), "KVT_UNKNOWN_STATUS");
  for (kvt_status s : {0, 1, 2, -1, -2, -3, -4, -5, -6, -7, -8, -9, -10, -99})
    EXPECT_STRNE(kvt_status_str(s), "KVT_UNKNOWN_STATUS") << s;
  EXPECT_NE(kvt_last_error(), nullptr);
  kvt_manager_config_init(nullptr);  // ignored, no crash
  kvt_manager_destroy(nullptr);
  kvt_seq_destroy(nullptr);
}

TEST(BadInput, ManagerCreate) {
  kvt_manager *m = reinterpret_cast<kvt_manager *>(0x1);
  kvt_manager_config c = small_config();
  EXPECT_KVT(kvt_manager_create(nullptr, &c), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_KVT(kvt_manager_create(&m, nullptr), KVT_ERR_INVALID_ARGUMENT);
  struct Bad {
    const char *what;
    void (*edit)(kvt_manager_config &);
  } bads[] = {
      {"struct_size", [](kvt_manager_config &c) { c.struct_size = 8; }},
      {"struct_size", [](kvt_manager_config &c) { c.struct_size += 8; }},
      {"page_size", [](kvt_manager_config &c) { c.page_size = 0; }},
      {"page_size", [](kvt_manager_config &c) { c.page_size = 24; }},
      {"page_size", [](kvt_manager_config &c) { c.page_size = 131072; }},
      {"num_layers", [](kvt_manager_config &c) { c.num_layers = 0; }},
      {"num_outer", [](kvt_manager_config &c) { c.num_outer = 3; }},
      {"chunk_bytes", [](kvt_manager_config &c) { c.chunk_bytes = ~uint64_t{0}; }},
      {"chunk_bytes", [](kvt_manager_config &c) {
         c.num_layers = 65536;
         c.chunk_bytes = uint64_t{1} << 20;
       }},
      {"g1_blocks", [](kvt_manager_config &c) { c.g1_blocks = 0; }},
      {"g1_blocks", [](kvt_manager_config &c) { c.g1_blocks = KVT_MAX_TIER_BLOCKS + 1; }},
      {"g2_blocks", [](kvt_manager_config &c) { c.g2_blocks = ~uint64_t{0}; }},
      {"g3_blocks", [](kvt_manager_config &c) { c.g3_blocks = uint64_t{1} << 40; }},
      {"event_capacity", [](kvt_manager_config &c) { c.event_capacity = 0; }},
      {"g1_memory", [](kvt_manager_config &c) { c.g1_memory = 9; }},
      {"cuda_device", [](kvt_manager_config &c) { c.cuda_device = -1; }},
      {"max_batch_size", [](kvt_manager_config &c) { c.max_batch_size = 0; }},
      {"min_batch_size", [](kvt_manager_config &c) { c.min_batch_size = c.max_batch_size + 1; }},
      {"policy_timeout_us", [](kvt_manager_config &c) { c.policy_timeout_us = 0; }},
      {"sweep_interval_us", [](kvt_manager_config &c) { c.sweep_interval_us = 1; }},
      {"max_concurrent_transfers", [](kvt_manager_config &c) { c.max_concurrent_transfers = 0; }},
      {"copy_threads", [](kvt_manager_config &c) { c.copy_threads = 65; }},
      {"policy_g1_g2", [](kvt_manager_config &c) { c.policy_g1_g2.flags = 8; }},
      {"policy_g2_g3", [](kvt_manager_config &c) {
         c.policy_g2_g3 = {KVT_POLICY_FREQUENCY, 0};
       }},
      {"g3_io", [](kvt_manager_config &c) { c.g3_io = 3; }},
      {"cuda_copy", [](kvt_manager_config &c) { c.cuda_copy = 4; }},
  };
  for (const Bad &b : bads) {
    kvt_manager_config bc = small_config();
    b.edit(bc);
    EXPECT_KVT(kvt_manager_create(&m, &bc), KVT_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(kvt_last_error()).find(b.what), std::string::npos)
        << b.what << ": " << kvt_last_error();
    EXPECT_EQ(m, reinterpret_cast<kvt_manager *>(0x1)) << "out touched on failure";
  }
}

TEST(BadInput, EngineLayout) {
  kvt_manager *m = nullptr;
  kvt_manager_config c = small_config();
  std::vector<char> mem(4096);
  const void *bases[4] = {mem.data(), mem.data() + 64, nullptr, mem.data() + 192};
  uint64_t strides[4] = {256, 256, 256, 256};
  kvt_g1_layout l{};
  l.struct_size = sizeof l;
  l.memory = KVT_MEMORY_HOST;
  l.bases = bases;
  l.strides = strides;
  c.g1_layout = &l;
  EXPECT_KVT(kvt_manager_create(&m, &c), KVT_ERR_INVALID_ARGUMENT);  // NULL base
  EXPECT_NE(std::string(kvt_last_error()).find("bases[2]"), std::string::npos);
  bases[2] = mem.data() + 128;
  strides[1] = 32;
  EXPECT_KVT(kvt_manager_create(&m, &c), KVT_ERR_INVALID_ARGUMENT);  // stride < chunk
  strides[1] = 256;
  l.struct_size = 4;
  EXPECT_KVT(kvt_manager_create(&m, &c), KVT_ERR_INVALID_ARGUMENT);
  l.struct_size = sizeof l;
  l.memory = 7;
  EXPECT_KVT(kvt_manager_create(&m, &c), KVT_ERR_INVALID_ARGUMENT);
  l.memory = KVT_MEMORY_CUDA;  // host memory, claimed to be the device's
  l.cuda_device = 0;
  if (kvt_status s = kvt_manager_create(&m, &c); s == KVT_ERR_UNSUPPORTED) {  // no GPU
    EXPECT_NE(std::string(kvt_last_error()).find("CUDA"), std::string::npos) << kvt_last_error();
  } else {
    EXPECT_EQ(s, KVT_ERR_INVALID_ARGUMENT) << kvt_last_error();
    EXPECT_NE(std::string(kvt_last_error()).find("not all memory of CUDA device 0"),
              std::string::npos) << kvt_last_error();
  }
  l.memory = KVT_MEMORY_HOST;
  ASSERT_KVT_OK(kvt_manager_create(&m, &c));
  kvt_manager_destroy(m);
}

TEST(BadInput, CudaMemoryWithoutDevice) {
  kvt_manager_config c = small_config();
  c.g1_memory = KVT_MEMORY_CUDA;
  kvt_manager *m = nullptr;
  kvt_status s = kvt_manager_create(&m, &c);
  if (s == KVT_OK) {
    kvt_manager_destroy(m);
    GTEST_SKIP() << "a CUDA device is present; this test checks the refusal without one";
  }
  EXPECT_EQ(s, KVT_ERR_UNSUPPORTED) << kvt_last_error();
}

TEST(BadInput, ForeignObjectPointers) {
  auto m = make(small_config());
  kvt_seq *s = nullptr;
  ASSERT_KVT_OK(kvt_seq_create(&s, 0, 4));
  // A sequence passed where a manager is expected, and the reverse.
  kvt_block b;
  EXPECT_KVT(kvt_block_alloc(&b, 1, reinterpret_cast<kvt_manager *>(s), KVT_TIER_G1),
             KVT_ERR_INVALID_HANDLE);
  EXPECT_KVT(kvt_seq_append(reinterpret_cast<kvt_seq *>(m.get()), nullptr, 0),
             KVT_ERR_INVALID_HANDLE);
  kvt_seq_destroy(s);
}

TEST(BadInput, BlockFunctions) {
  auto mp = make(small_config(4, 4, 4));
  kvt_manager *m = mp.get();
  auto held = store(m, {1, 2});
  kvt_block b = alloc(m, 1)[0], out = 0;
  size_t n = 0;
  void *p = nullptr;
  const uint64_t h[2] = {1, 2};
  kvt_block many[2];

  // NULL manager everywhere.
  EXPECT_REFUSED(m, kvt_block_alloc(&out, 1, nullptr, KVT_TIER_G1), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_REFUSED(m, kvt_block_release(nullptr, &b, 1), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_REFUSED(m, kvt_block_retain(nullptr, held[0]), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_REFUSED(m, kvt_block_register_hash(&out, nullptr, b, 9, 0), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_REFUSED(m, kvt_tier_match_prefix(&n, many, nullptr, KVT_TIER_G1, h, 2),
                 KVT_ERR_INVALID_ARGUMENT);
  EXPECT_REFUSED(m, kvt_block_data(&p, &n, nullptr, b), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_REFUSED(m, kvt_block_chunk(&p, nullptr, b, 0, 0), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_REFUSED(m, kvt_block_init(nullptr, b, 0, 0), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_REFUSED(m, kvt_block_append(nullptr, b, nullptr, 0), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_REFUSED(m, kvt_block_schedule(nullptr, b), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_REFUSED(m, kvt_block_unschedule(nullptr, b), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_REFUSED(m, kvt_block_compute_done(nullptr, b), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_REFUSED(m, kvt_block_register(&out, nullptr, b), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_REFUSED(m, kvt_manager_check(nullptr), KVT_ERR_INVALID_ARGUMENT);

  // NULL out-parameters and arrays.
  EXPECT_REFUSED(m, kvt_block_alloc(nullptr, 1, m, KVT_TIER_G1), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_REFUSED(m, kvt_block_release(m, nullptr, 1), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_REFUSED(m, kvt_block_register_hash(nullptr, m, b, 9, 0), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_REFUSED(m, kvt_block_register(nullptr, m, b), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_REFUSED(m, kvt_tier_match_prefix(nullptr, many, m, KVT_TIER_G1, h, 2),
                 KVT_ERR_INVALID_ARGUMENT);
  EXPECT_REFUSED(m, kvt_tier_match_prefix(&n, nullptr, m, KVT_TIER_G1, h, 2),
                 KVT_ERR_INVALID_ARGUMENT);
  EXPECT_REFUSED(m, kvt_tier_match_prefix(&n, many, m, KVT_TIER_G1, nullptr, 2),
                 KVT_ERR_INVALID_ARGUMENT);
  EXPECT_REFUSED(m, kvt_block_data(nullptr, &n, m, b), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_REFUSED(m, kvt_block_data(&p, nullptr, m, b), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_REFUSED(m, kvt_block_chunk(nullptr, m, b, 0, 0), KVT_ERR_INVALID_ARGUMENT);
  kvt_block_info bi{};
  EXPECT_REFUSED(m, kvt_block_info_get(nullptr, m, b), KVT_ERR_INVALID_ARGUMENT);
  bi.struct_size = 3;
  EXPECT_REFUSED(m, kvt_block_info_get(&bi, m, b), KVT_ERR_INVALID_ARGUMENT);

  // Zero and huge counts.
  EXPECT_REFUSED(m, kvt_block_alloc(&out, 0, m, KVT_TIER_G1), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_REFUSED(m, kvt_block_alloc(&out, SIZE_MAX, m, KVT_TIER_G1), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_REFUSED(m, kvt_block_release(m, &b, SIZE_MAX / 2), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_REFUSED(m, kvt_tier_match_prefix(&n, many, m, KVT_TIER_G1, h, SIZE_MAX),
                 KVT_ERR_INVALID_ARGUMENT);
  EXPECT_REFUSED(m, kvt_block_alloc(many, 5, m, KVT_TIER_G1), KVT_ERR_NO_SPACE);
  // Empty lists are valid no-ops.
  EXPECT_KVT(kvt_block_release(m, nullptr, 0), KVT_OK);

  // Unknown and absent tiers.
  kvt_manager_config c2 = small_config(4, 0, 0);
  auto no_g2 = make(c2);
  for (int t : {0, 4, -1, 1000}) {
    EXPECT_REFUSED(m, kvt_block_alloc(&out, 1, m, kvt_tier(t)), KVT_ERR_INVALID_ARGUMENT);
    EXPECT_REFUSED(m, kvt_tier_match_prefix(&n, many, m, kvt_tier(t), h, 2),
                   KVT_ERR_INVALID_ARGUMENT);
    kvt_tier_stats st{};
    st.struct_size = sizeof st;
    EXPECT_REFUSED(m, kvt_tier_stats_get(&st, m, kvt_tier(t)), KVT_ERR_INVALID_ARGUMENT);
  }
  EXPECT_KVT(kvt_block_alloc(&out, 1, no_g2.get(), KVT_TIER_G2), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kvt_last_error()).find("absent"), std::string::npos);
  kvt_tier_stats st{};
  EXPECT_REFUSED(m, kvt_tier_stats_get(&st, m, KVT_TIER_G1), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_REFUSED(m, kvt_tier_stats_get(nullptr, m, KVT_TIER_G1), KVT_ERR_INVALID_ARGUMENT);

  // Chunk coordinates outside the geometry.
  EXPECT_REFUSED(m, kvt_block_chunk(&p, m, b, 2, 0), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_REFUSED(m, kvt_block_chunk(&p, m, b, 0, 2), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_REFUSED(m, kvt_block_append(m, b, nullptr, 3), KVT_ERR_INVALID_ARGUMENT);
}

TEST(BadInput, HashFunctions) {
  uint64_t out[4];
  size_t n = 0;
  const uint32_t toks[8] = {};
  EXPECT_KVT(kvt_hash_salt(nullptr, "a", 1), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_KVT(kvt_hash_salt(out, nullptr, 5), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_KVT(kvt_hash_salt(out, nullptr, 0), KVT_OK);  // the empty salt
  EXPECT_KVT(kvt_hash_tokens(out, 4, nullptr, 0, toks, 8, 2), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_KVT(kvt_hash_tokens(out, 4, &n, 0, nullptr, 8, 2), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_KVT(kvt_hash_tokens(nullptr, 4, &n, 0, toks, 8, 2), KVT_ERR_INVALID_ARGUMENT);
  for (uint32_t page : {0u, 3u, 100u, 131072u, 0x80000000u})
    EXPECT_KVT(kvt_hash_tokens(out, 4, &n, 0, toks, 8, page), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_KVT(kvt_hash_tokens(out, 4, &n, 0, toks, SIZE_MAX, 2), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_KVT(kvt_hash_tokens(out, 4, &n, 0, nullptr, 0, 2), KVT_OK);
  EXPECT_EQ(n, 0u);

  kvt_seq *s = nullptr;
  EXPECT_KVT(kvt_seq_create(nullptr, 0, 4), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_KVT(kvt_seq_create(&s, 0, 0), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_KVT(kvt_seq_create(&s, 0, 6), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(s, nullptr);
  ASSERT_KVT_OK(kvt_seq_create(&s, 0, 4));
  EXPECT_KVT(kvt_seq_append(nullptr, toks, 1), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_KVT(kvt_seq_append(s, nullptr, 1), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_KVT(kvt_seq_append(s, toks, SIZE_MAX), KVT_ERR_INVALID_ARGUMENT);
  size_t a = 0, b = 0;
  EXPECT_KVT(kvt_seq_info(nullptr, &b, s), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_KVT(kvt_seq_info(&a, nullptr, s), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_KVT(kvt_seq_info(&a, &b, nullptr), KVT_ERR_INVALID_ARGUMENT);
  ASSERT_KVT_OK(kvt_seq_info(&a, &b, s));
  EXPECT_EQ(a, 0u);  // the failed appends added nothing
  EXPECT_KVT(kvt_seq_copy_hashes(out, out, 4, nullptr, s, 0), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_KVT(kvt_seq_copy_hashes(nullptr, nullptr, 4, &n, s, 0), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_KVT(kvt_seq_copy_hashes(out, out, 4, &n, s, 1), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_KVT(kvt_seq_copy_hashes(out, out, 4, &n, nullptr, 0), KVT_ERR_INVALID_ARGUMENT);
  kvt_seq_destroy(s);
}
