// The config's G3 fault injector (for tests): validated field by field, and failing exactly
// the operations it names, only their transfers, with the errno it names.
#include <cerrno>

#include "test_g3_support.hpp"

using namespace kvt_test;

namespace {

kvt_status finish(kvt_xfer *x) { return kvt_xfer_wait(x, int64_t(30) * 1000 * 1000 * 1000); }

// Registers n fresh G1 blocks under hashes first.. and offloads them to G3 as one transfer.
kvt_status offload_fresh(kvt_manager *m, uint64_t first, size_t n) {
  std::vector<kvt_block> b = alloc(m, n), r(n);
  std::vector<uint64_t> h(n);
  for (size_t i = 0; i < n; ++i) h[i] = first + i;
  EXPECT_EQ(kvt_block_register_hashes(r.data(), m, b.data(), h.data(), n, 0), KVT_OK);
  kvt_xfer *x = nullptr;
  EXPECT_EQ(kvt_xfer_offload(&x, m, r.data(), n, KVT_TIER_G3, nullptr, 0), KVT_OK);
  kvt_status s = finish(x);
  kvt_xfer_release(x);
  kvt_block_release(m, r.data(), n);
  return s;
}

// Onboards the G3 copy of hash h into a fresh G1 block.
kvt_status onboard_one(kvt_manager *m, uint64_t h) {
  kvt_block src = 0, dst = 0;
  size_t hit = 0;
  EXPECT_EQ(kvt_tier_match_prefix(&hit, &src, m, KVT_TIER_G3, &h, 1), KVT_OK);
  if (hit != 1) return KVT_ERR_STATE;
  EXPECT_EQ(kvt_block_alloc(&dst, 1, m, KVT_TIER_G1), KVT_OK);
  kvt_xfer *x = nullptr;
  EXPECT_EQ(kvt_xfer_onboard(&x, m, &src, &dst, 1, nullptr, 0), KVT_OK);
  kvt_status s = finish(x);
  kvt_block fin = dst;
  if (s == KVT_OK) kvt_xfer_blocks(&fin, 1, x);
  kvt_xfer_release(x);
  kvt_block_release(m, &fin, 1);
  kvt_block_release(m, &src, 1);
  return s;
}

}  // namespace

TEST(G3Faults, FieldsAreValidated) {
  TempDir dir;
  struct Case {
    const char *field;
    void (*set)(kvt_manager_config &);
  } cases[] = {
      {"g3_fault_op", [](kvt_manager_config &c) { c.g3_fault_op = 3; }},
      {"g3_fault_errno",
       [](kvt_manager_config &c) { c.g3_fault_op = KVT_G3_FAULT_WRITE, c.g3_fault_count = 1; }},
      {"g3_fault_errno", [](kvt_manager_config &c) {
         c.g3_fault_op = KVT_G3_FAULT_READ, c.g3_fault_errno = -5, c.g3_fault_count = 1;
       }},
      {"g3_fault_errno", [](kvt_manager_config &c) {
         c.g3_fault_op = KVT_G3_FAULT_READ, c.g3_fault_errno = 5000, c.g3_fault_count = 1;
       }},
      {"g3_fault_count",
       [](kvt_manager_config &c) { c.g3_fault_op = KVT_G3_FAULT_WRITE, c.g3_fault_errno = EIO; }},
      {"g3_fault_op is OFF", [](kvt_manager_config &c) { c.g3_fault_errno = ENOSPC; }},
      {"g3_fault_op is OFF", [](kvt_manager_config &c) { c.g3_fault_count = 1; }},
  };
  for (const Case &k : cases) {
    kvt_manager_config c = g3_config(dir.path.c_str());
    k.set(c);
    kvt_manager *m = nullptr;
    EXPECT_KVT(kvt_manager_create(&m, &c), KVT_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(m, nullptr);
    EXPECT_NE(std::string(kvt_last_error()).find(k.field), std::string::npos)
        << k.field << ": " << kvt_last_error();
  }
  EXPECT_TRUE(dir.names().empty()) << "a refused config created a file";
}

// The library reads no environment variable to inject faults any more.
TEST(G3Faults, EnvironmentInjectsNothing) {
  TempDir dir;
  setenv("KVTIER_FAULT_G3", "write:28:0:100", 1);
  auto m = make(g3_config(dir.path.c_str()));
  unsetenv("KVTIER_FAULT_G3");
  EXPECT_KVT(offload_fresh(m.get(), 1, 2), KVT_OK);
}

TEST(G3Faults, WritesFailAfterSkipForCountThenPass) {
  TempDir dir;
  kvt_manager_config c = g3_config(dir.path.c_str());
  c.g3_fault_op = KVT_G3_FAULT_WRITE;
  c.g3_fault_errno = ENOSPC;
  c.g3_fault_skip = 1;
  c.g3_fault_count = 2;
  auto m = make(c);
  EXPECT_KVT(offload_fresh(m.get(), 10, 1), KVT_OK);     // skipped
  EXPECT_KVT(offload_fresh(m.get(), 20, 1), KVT_ERR_IO);  // fails
  EXPECT_NE(std::string(kvt_last_error()).find("No space left"), std::string::npos)
      << kvt_last_error();
  EXPECT_KVT(offload_fresh(m.get(), 30, 1), KVT_ERR_IO);  // fails
  EXPECT_KVT(offload_fresh(m.get(), 40, 1), KVT_OK);      // passes again
  EXPECT_EQ(stats(m.get(), KVT_TIER_G3).registered, 2u) << "a failed write was registered";
  EXPECT_EQ(onboard_one(m.get(), 10), KVT_OK);
  EXPECT_EQ(onboard_one(m.get(), 40), KVT_OK);
  EXPECT_KVT(kvt_manager_check(m.get()), KVT_OK);
}

// A failed offload gives back its "on its way" marks before its wait returns: offloading the
// same block again right after moves it (the presence policy must not skip it).
TEST(G3Faults, RetryAfterAFailedOffloadIsNotFilteredAsPresent) {
  TempDir dir;
  kvt_manager_config c = g3_config(dir.path.c_str());
  c.g3_fault_op = KVT_G3_FAULT_WRITE;
  c.g3_fault_errno = EIO;
  c.g3_fault_count = 50;
  auto m = make(c);
  kvt_block b = alloc(m.get(), 1)[0], r = 0;
  ASSERT_EQ(kvt_block_register_hash(&r, m.get(), b, 77, 0), KVT_OK);
  for (int i = 0; i < 60; ++i) {
    kvt_xfer *x = nullptr;
    ASSERT_EQ(kvt_xfer_offload(&x, m.get(), &r, 1, KVT_TIER_G3, nullptr, 0), KVT_OK);
    kvt_status s = finish(x);
    uint64_t moved = 99;
    ASSERT_EQ(kvt_xfer_status(nullptr, nullptr, &moved, x), KVT_OK);
    kvt_xfer_release(x);
    ASSERT_EQ(s, i < 50 ? KVT_ERR_IO : KVT_OK) << "try " << i << ": " << kvt_last_error();
    if (i >= 50) {
      ASSERT_EQ(moved, i == 50 ? 1u : 0u) << "try " << i << ": filtered or doubled";
    }
  }
  kvt_block_release(m.get(), &r, 1);
  EXPECT_KVT(kvt_manager_check(m.get()), KVT_OK);
}

TEST(G3Faults, ReadFaultFailsOnlyThatOnboard) {
  TempDir dir;
  kvt_manager_config c = g3_config(dir.path.c_str());
  c.g3_fault_op = KVT_G3_FAULT_READ;
  c.g3_fault_errno = EIO;
  c.g3_fault_skip = 1;
  c.g3_fault_count = 1;
  auto m = make(c);
  ASSERT_KVT_OK(offload_fresh(m.get(), 1, 3));
  EXPECT_KVT(onboard_one(m.get(), 1), KVT_OK);
  EXPECT_KVT(onboard_one(m.get(), 2), KVT_ERR_IO);
  EXPECT_NE(std::string(kvt_last_error()).find("Input/output error"), std::string::npos)
      << kvt_last_error();
  EXPECT_KVT(onboard_one(m.get(), 3), KVT_OK);
  EXPECT_KVT(kvt_manager_check(m.get()), KVT_OK);
}
