// Every legal and every illegal transition of DESIGN section 2's block state machine.
#include <array>
#include <functional>

#include "support.hpp"

using namespace kvt_test;

namespace {

const uint32_t kTokens[4] = {11, 12, 13, 14};

enum Op { INIT, APPEND, SCHEDULE, UNSCHEDULE, DONE, REGISTER, REGISTER_HASH, kOps };
const char *kOpName[kOps] = {"init", "append", "schedule", "unschedule", "compute_done",
                             "register", "register_hash"};

kvt_status apply(kvt_manager *m, kvt_block b, Op op, kvt_block *out) {
  switch (op) {
    case INIT: return kvt_block_init(m, b, 7, 0);
    case APPEND: return kvt_block_append(m, b, kTokens, 1);
    case SCHEDULE: return kvt_block_schedule(m, b);
    case UNSCHEDULE: return kvt_block_unschedule(m, b);
    case DONE: return kvt_block_compute_done(m, b);
    case REGISTER: return kvt_block_register(out, m, b);
    case REGISTER_HASH: return kvt_block_register_hash(out, m, b, 0xabcdef, 0);
    default: return KVT_ERR_INTERNAL;
  }
}

// Brings a fresh block to the given state along the legal path.
kvt_block reach(kvt_manager *m, kvt_block_state target) {
  kvt_block b = alloc(m, 1)[0];
  if (target == KVT_BLOCK_EMPTY) return b;
  EXPECT_EQ(kvt_block_init(m, b, 7, 0), KVT_OK);
  if (target == KVT_BLOCK_PARTIAL) return b;
  uint32_t room = target >= KVT_BLOCK_COMPLETE ? 4 : 2;
  EXPECT_EQ(kvt_block_append(m, b, kTokens, room), KVT_OK);
  if (target == KVT_BLOCK_READY) return b;
  EXPECT_EQ(kvt_block_schedule(m, b), KVT_OK);
  if (target == KVT_BLOCK_INFLIGHT) return b;
  EXPECT_EQ(kvt_block_compute_done(m, b), KVT_OK);
  if (target == KVT_BLOCK_COMPLETE) return b;
  kvt_block r = 0;
  EXPECT_EQ(kvt_block_register(&r, m, b), KVT_OK);
  if (target == KVT_BLOCK_REGISTERED) return r;
  EXPECT_EQ(kvt_block_release(m, &r, 1), KVT_OK);
  return r;  // Inactive
}

}  // namespace

// The full table: for each state, which operations are legal and where they lead.
// 0 means KVT_ERR_STATE and no change.
TEST(Lifecycle, EveryTransitionFromEveryState) {
  using S = kvt_block_state;
  struct Row {
    S from;
    std::array<int, kOps> to;
  };
  const Row table[] = {
      //                  init        append      sched        unsched    done   register   reg_hash
      {KVT_BLOCK_EMPTY, {KVT_BLOCK_PARTIAL, 0, 0, 0, 0, 0, KVT_BLOCK_REGISTERED}},
      {KVT_BLOCK_PARTIAL, {0, KVT_BLOCK_READY, 0, 0, 0, 0, 0}},
      {KVT_BLOCK_READY, {0, KVT_BLOCK_READY, KVT_BLOCK_INFLIGHT, KVT_BLOCK_PARTIAL, 0, 0, 0}},
      {KVT_BLOCK_INFLIGHT, {0, 0, 0, 0, KVT_BLOCK_PARTIAL, 0, 0}},
      {KVT_BLOCK_COMPLETE, {0, 0, 0, 0, 0, KVT_BLOCK_REGISTERED, KVT_BLOCK_REGISTERED}},
      {KVT_BLOCK_REGISTERED, {0, 0, 0, 0, 0, 0, 0}},
      {KVT_BLOCK_INACTIVE, {0, 0, 0, 0, 0, 0, 0}},
  };
  for (const Row &row : table) {
    for (int op = 0; op < kOps; ++op) {
      auto m = make(small_config(16, 0));
      kvt_block b = reach(m.get(), row.from);
      ASSERT_EQ(state_of(m.get(), b), uint32_t(row.from));
      Snapshot before(m.get());
      kvt_block_info info_before = info(m.get(), b);
      kvt_block out = 0;
      kvt_status s = apply(m.get(), b, Op(op), &out);
      SCOPED_TRACE(std::string("state ") + std::to_string(row.from) + " op " + kOpName[op]);
      if (row.to[op] == 0) {
        EXPECT_EQ(s, KVT_ERR_STATE) << kvt_last_error();
        EXPECT_NE(std::string(kvt_last_error()).find("state"), std::string::npos);
        EXPECT_TRUE(Snapshot(m.get()) == before);
        kvt_block_info after = info(m.get(), b);
        EXPECT_EQ(after.state, info_before.state);
        EXPECT_EQ(after.tokens, info_before.tokens);
        EXPECT_EQ(after.refs, info_before.refs);
      } else {
        EXPECT_EQ(s, KVT_OK) << kvt_last_error();
        kvt_block now = (op == REGISTER || op == REGISTER_HASH) ? out : b;
        EXPECT_EQ(state_of(m.get(), now), uint32_t(row.to[op]));
      }
      EXPECT_KVT(kvt_manager_check(m.get()), KVT_OK);
    }
  }
}

TEST(Lifecycle, ComputeDoneOnFullBlockCompletes) {
  auto m = make(small_config(4, 0));
  kvt_block b = reach(m.get(), KVT_BLOCK_INFLIGHT);  // 2 tokens of 4: not full
  ASSERT_KVT_OK(kvt_block_compute_done(m.get(), b));
  EXPECT_EQ(state_of(m.get(), b), uint32_t(KVT_BLOCK_PARTIAL));
  ASSERT_KVT_OK(kvt_block_append(m.get(), b, kTokens, 2));
  ASSERT_KVT_OK(kvt_block_schedule(m.get(), b));
  ASSERT_KVT_OK(kvt_block_compute_done(m.get(), b));
  EXPECT_EQ(state_of(m.get(), b), uint32_t(KVT_BLOCK_COMPLETE));
  EXPECT_EQ(info(m.get(), b).tokens, 4u);
}

TEST(Lifecycle, UnscheduleKeepsTokens) {
  auto m = make(small_config(4, 0));
  kvt_block b = reach(m.get(), KVT_BLOCK_READY);
  ASSERT_KVT_OK(kvt_block_unschedule(m.get(), b));
  EXPECT_EQ(info(m.get(), b).tokens, 2u);
  EXPECT_EQ(state_of(m.get(), b), uint32_t(KVT_BLOCK_PARTIAL));
}

TEST(Lifecycle, AppendBeyondPageIsRefusedAndChangesNothing) {
  auto m = make(small_config(4, 0));
  kvt_block b = reach(m.get(), KVT_BLOCK_READY);  // 2 of 4 tokens
  EXPECT_KVT(kvt_block_append(m.get(), b, kTokens, 3), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_KVT(kvt_block_append(m.get(), b, kTokens, 0), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_KVT(kvt_block_append(m.get(), b, nullptr, 1), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(info(m.get(), b).tokens, 2u);
  EXPECT_EQ(state_of(m.get(), b), uint32_t(KVT_BLOCK_READY));
}

// The token path computes the same chained hash as kvt_hash_tokens.
TEST(Lifecycle, TokenPathHashEqualsStatelessHash) {
  auto m = make(small_config(4, 0));
  uint64_t salt = 0;
  ASSERT_KVT_OK(kvt_hash_salt(&salt, "tenant", 6));
  const uint32_t toks[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  uint64_t want[2];
  size_t n = 0;
  ASSERT_KVT_OK(kvt_hash_tokens(want, 2, &n, salt, toks, 8, 4));
  ASSERT_EQ(n, 2u);
  uint64_t parent = 0;
  for (int i = 0; i < 2; ++i) {
    kvt_block b = alloc(m.get(), 1)[0], r = 0;
    ASSERT_KVT_OK(kvt_block_init(m.get(), b, salt, parent));
    ASSERT_KVT_OK(kvt_block_append(m.get(), b, toks + 4 * i, 1));
    ASSERT_KVT_OK(kvt_block_append(m.get(), b, toks + 4 * i + 1, 3));
    ASSERT_KVT_OK(kvt_block_schedule(m.get(), b));
    ASSERT_KVT_OK(kvt_block_compute_done(m.get(), b));
    ASSERT_KVT_OK(kvt_block_register(&r, m.get(), b));
    kvt_block_info bi = info(m.get(), r);
    EXPECT_EQ(bi.seq_hash, want[i]);
    EXPECT_EQ(bi.parent_hash, parent);
    parent = bi.seq_hash;
  }
}

TEST(Lifecycle, RegisterHashOfHashPathBlockWithoutTokensPath) {
  auto m = make(small_config(4, 0));
  kvt_block b = alloc(m.get(), 1)[0], r = 0;
  ASSERT_KVT_OK(kvt_block_register_hash(&r, m.get(), b, 42, 41));
  EXPECT_EQ(r, b);
  kvt_block_info bi = info(m.get(), r);
  EXPECT_EQ(bi.state, uint32_t(KVT_BLOCK_REGISTERED));
  EXPECT_EQ(bi.seq_hash, 42u);
  EXPECT_EQ(bi.parent_hash, 41u);
  EXPECT_EQ(bi.refs, 1u);
}

// Releasing a mutable block at any stage returns it to the free pool and its handle goes
// stale; its token buffer is gone with it.
TEST(Lifecycle, ReleaseAtEveryMutableStateFreesTheSlot) {
  for (kvt_block_state st : {KVT_BLOCK_EMPTY, KVT_BLOCK_PARTIAL, KVT_BLOCK_READY,
                             KVT_BLOCK_INFLIGHT, KVT_BLOCK_COMPLETE}) {
    auto m = make(small_config(4, 0));
    kvt_block b = reach(m.get(), st);
    ASSERT_KVT_OK(kvt_block_release(m.get(), &b, 1));
    kvt_tier_stats s = stats(m.get(), KVT_TIER_G1);
    EXPECT_EQ(s.free, 4u);
    EXPECT_EQ(s.active, 0u);
    kvt_block_info bi{};
    bi.struct_size = sizeof bi;
    EXPECT_KVT(kvt_block_info_get(&bi, m.get(), b), KVT_ERR_INVALID_HANDLE);
    EXPECT_KVT(kvt_manager_check(m.get()), KVT_OK);
  }
}
