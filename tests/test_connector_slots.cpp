// The slot state machine of seed 004, transition by transition: every legal transition of
// the header's table with its trigger (the state before and after the call, the history and
// the counters), then the transitions it does not list, which fail with KVT_ERR_STATE, say
// why, and leave every slot as it was.
#include "connector_support.hpp"

using namespace kvt_conn_test;

namespace {

constexpr uint32_t I = KVT_SLOT_INITIALIZED, OS = KVT_SLOT_ONBOARD_STAGED,
                   OB = KVT_SLOT_ONBOARDING, PF = KVT_SLOT_PREFILLING, DC = KVT_SLOT_DECODING,
                   SP = KVT_SLOT_SKIPPED_PREFILL, SD = KVT_SLOT_SKIPPED_DECODE,
                   PE = KVT_SLOT_PREEMPTED, FG = KVT_SLOT_FINISHING, FD = KVT_SLOT_FINISHED;

// 40 tokens of request k's own (two full blocks and 8 more) that no other request shares.
std::vector<uint32_t> own(uint32_t k) { return token_range(10000 + 1000 * k, 40); }

// The last n states of the slot's history.
std::vector<std::string> last(kvt_connector *c, const std::string &id, size_t n) {
  auto h = history(c, id);
  return h.size() <= n ? h : std::vector<std::string>(h.end() - long(n), h.end());
}

struct Slots : ::testing::Test {
  Rig r;
  std::vector<uint64_t> ha = hashes_of(seed_a()), hb = hashes_of(seed_b());

  // A request of its own tokens on G1 blocks {base, base + 1, base + 2}, its first chunk
  // (`tokens` of 40) computed in one step: PREFILLING.
  void prefill(const std::string &id, uint32_t k, uint32_t base, uint64_t tokens = 40) {
    auto t = own(k);
    auto h = hashes_of(t);
    ASSERT_EQ(r.match(id, t).first, 0u);
    ASSERT_KVT_OK(r.alloc(id, {base, base + 1, base + 2}, 0));
    Forward fwd;
    for (uint64_t i = 0; i < tokens / kPage; ++i) fwd.push_back({base + uint32_t(i), h[i]});
    uint64_t stored = r.stats().stored_blocks + fwd.size();
    r.step(r.meta({{id, 0, tokens}}), fwd, r.counts(stored, r.stats().loaded_blocks));
    ASSERT_EQ(slot_state(r.c, id), PF);
  }
  // prefill, then one decode step: DECODING.
  void decode(const std::string &id, uint32_t k, uint32_t base) {
    prefill(id, k, base);
    r.step(r.meta({{id, 40, 1, {}, {7}}}));
    ASSERT_EQ(slot_state(r.c, id), DC);
  }
  // Seed 003's B (A's prefix in G2) matched: ONBOARD_STAGED.
  void stage(const std::string &id) {
    if (r.held(ha) < 2) r.run_a();
    ASSERT_EQ(r.match(id, seed_b()).first, 32u);
    ASSERT_EQ(slot_state(r.c, id), OS);
  }
  // ... and allocated on G1 blocks {base..base + 3}: ONBOARDING.
  void onboard(const std::string &id, uint32_t base) {
    stage(id);
    ASSERT_KVT_OK(r.alloc(id, {base, base + 1, base + 2, base + 3}, 32));
    ASSERT_EQ(slot_state(r.c, id), OB);
  }
};

}  // namespace

TEST_F(Slots, FirstMatchCreatesAnInitializedSlot) {
  EXPECT_EQ(slot_state(r.c, "R"), 0u);
  EXPECT_EQ(r.match("R", own(1)), std::make_pair(uint64_t{0}, int32_t{0}));
  EXPECT_EQ(history(r.c, "R"), names({I}));
  EXPECT_EQ(r.stats().transitions[0][I], 1u);
}

TEST_F(Slots, MatchInG2StagesTheOnboard) {
  r.run_a();
  EXPECT_EQ(r.match("B", seed_b()).first, 32u);
  EXPECT_EQ(history(r.c, "B"), names({I, OS}));
  EXPECT_EQ(r.stats().transitions[I][OS], 1u);
}

TEST_F(Slots, AllocWithExternalTokensOnboardsAndSchedulingPrefills) {
  stage("B");
  ASSERT_KVT_OK(r.alloc("B", {4, 5, 6, 7}, 32));
  EXPECT_EQ(history(r.c, "B"), names({I, OS, OB}));
  std::string meta = r.meta({{"B", 32, 20}});
  EXPECT_EQ(history(r.c, "B"), names({I, OS, OB, PF}));
  r.step(meta, {{6, hb[2]}}, r.counts(3, 2));
  EXPECT_TRUE(r.g1.holds(4, ha[0]) && r.g1.holds(5, ha[1]));
  kvt_connector_stats s = r.stats();
  EXPECT_EQ(s.transitions[OS][OB], 1u);
  EXPECT_EQ(s.transitions[OB][PF], 1u);
  EXPECT_EQ(s.matched_tokens, 32u);
}

TEST_F(Slots, AllocWithoutExternalTokensDeclinesTheHit) {
  stage("B");
  ASSERT_KVT_OK(r.alloc("B", {4, 5, 6, 7}, 0));
  EXPECT_EQ(history(r.c, "B"), names({I, OS, I}));
  EXPECT_EQ(stats(r.m.get(), KVT_TIER_G2).active, 0u) << "the declined hit is still pinned";
  EXPECT_EQ(r.stats().transitions[OS][I], 1u);
  EXPECT_EQ(r.stats().matched_tokens, 0u) << "a declined hit counts as matched";
  // B computes all three blocks; nothing is loaded.
  r.step(r.meta({{"B", 0, 52}}), {{4, hb[0]}, {5, hb[1]}, {6, hb[2]}}, r.counts(3, 0));
  EXPECT_EQ(history(r.c, "B"), names({I, OS, I, PF}));
  EXPECT_EQ(r.g2_holding(hb), 3u);
}

TEST_F(Slots, MatchAgainBeforeAllocMatchesAnew) {
  stage("B");
  EXPECT_EQ(r.match("B", seed_b()).first, 32u);
  EXPECT_EQ(slot_state(r.c, "B"), OS);
  ASSERT_KVT_OK(r.alloc("B", {4, 5, 6, 7}, 32));
  r.step(r.meta({{"B", 32, 20}}), {{6, hb[2]}}, r.counts(3, 2));
  EXPECT_EQ(r.finish("B"), 0);
  EXPECT_EQ(stats(r.m.get(), KVT_TIER_G2).active, 0u) << "the first match's pins leaked";
  EXPECT_KVT(kvt_manager_check(r.m.get()), KVT_OK);
}

TEST_F(Slots, SchedulingAnInitializedSlotPrefills) {
  ASSERT_EQ(r.match("R", own(1)).first, 0u);
  ASSERT_KVT_OK(r.alloc("R", {1, 2, 3}, 0));
  EXPECT_EQ(slot_state(r.c, "R"), I);
  std::string meta = r.meta({{"R", 0, 40}});
  EXPECT_EQ(history(r.c, "R"), names({I, PF}));
  EXPECT_EQ(r.stats().transitions[I][PF], 1u);
  auto h = hashes_of(own(1));
  r.step(meta, {{1, h[0]}, {2, h[1]}}, r.counts(2, 0));
}

TEST_F(Slots, PreemptedSlotWithoutAHitIsScheduledAgain) {
  prefill("R", 1, 1, 8);  // no full block yet: nothing stored, nothing to match later
  ASSERT_KVT_OK(kvt_connector_request_preempted(r.c, "R"));
  EXPECT_EQ(history(r.c, "R"), names({I, PF, PE}));
  EXPECT_EQ(r.match("R", own(1)).first, 0u);
  EXPECT_EQ(slot_state(r.c, "R"), PE);
  ASSERT_KVT_OK(r.alloc("R", {7, 8, 9}, 0));
  EXPECT_EQ(slot_state(r.c, "R"), PE);
  auto h = hashes_of(own(1));
  r.step(r.meta({{"R", 0, 40}}), {{7, h[0]}, {8, h[1]}}, r.counts(2, 0));
  EXPECT_EQ(history(r.c, "R"), names({I, PF, PE, PF}));
  kvt_connector_stats s = r.stats();
  EXPECT_EQ(s.transitions[PF][PE], 1u);
  EXPECT_EQ(s.transitions[PE][PF], 1u);
  EXPECT_EQ(s.preemptions, 1u);
}

TEST_F(Slots, PreemptedSlotWithAHitStagesAgain) {
  onboard("B", 4);
  r.step(r.meta({{"B", 32, 8}}), {}, r.counts(2, 2));
  ASSERT_KVT_OK(kvt_connector_request_preempted(r.c, "B"));
  EXPECT_EQ(r.match("B", seed_b()).first, 32u);
  EXPECT_EQ(history(r.c, "B"), names({I, OS, OB, PF, PE, OS}));
  EXPECT_EQ(r.stats().transitions[PE][OS], 1u);
}

TEST_F(Slots, ChunkedPrefillStaysPrefilling) {
  prefill("R", 1, 1, 16);
  auto h = hashes_of(own(1));
  r.step(r.meta({{"R", 16, 24}}), {{2, h[1]}}, r.counts(2, 0));
  EXPECT_EQ(slot_state(r.c, "R"), PF);
  EXPECT_EQ(r.stats().transitions[PF][PF], 1u);
  auto hist = history(r.c, "R");
  ASSERT_GE(hist.size(), 2u);
  EXPECT_EQ(std::vector<std::string>(hist.begin(), hist.begin() + 2), names({I, PF}));
  for (size_t i = 2; i < hist.size(); ++i) EXPECT_EQ(hist[i], "KVT_SLOT_PREFILLING");
}

TEST_F(Slots, SampledTokensDecode) {
  prefill("R", 1, 1);
  std::string meta = r.meta({{"R", 40, 1, {}, {7}}});
  EXPECT_EQ(history(r.c, "R"), names({I, PF, DC}));
  r.step(meta);
  r.step(r.meta({{"R", 41, 1, {}, {8}}}));
  EXPECT_EQ(slot_state(r.c, "R"), DC);
  EXPECT_EQ(r.stats().transitions[PF][DC], 1u);
  EXPECT_EQ(r.stats().transitions[DC][DC], 1u);
}

TEST_F(Slots, SkippedPrefillResumesPrefilling) {
  prefill("R", 1, 1, 16);
  r.step(r.meta({}));
  EXPECT_EQ(history(r.c, "R"), names({I, PF, SP}));
  auto h = hashes_of(own(1));
  r.step(r.meta({{"R", 16, 24}}), {{2, h[1]}}, r.counts(2, 0));
  EXPECT_EQ(history(r.c, "R"), names({I, PF, SP, PF}));
  EXPECT_EQ(r.stats().transitions[PF][SP], 1u);
  EXPECT_EQ(r.stats().transitions[SP][PF], 1u);
}

TEST_F(Slots, SkippedPrefillResumesDecoding) {
  prefill("R", 1, 1);
  r.step(r.meta({}));
  r.step(r.meta({{"R", 40, 1, {}, {7}}}));
  EXPECT_EQ(history(r.c, "R"), names({I, PF, SP, DC}));
  EXPECT_EQ(r.stats().transitions[SP][DC], 1u);
}

TEST_F(Slots, SkippedDecodeResumesDecoding) {
  decode("R", 1, 1);
  r.step(r.meta({}));
  EXPECT_EQ(history(r.c, "R"), names({I, PF, DC, SD}));
  r.step(r.meta({{"R", 41, 1, {}, {8}}}));
  EXPECT_EQ(history(r.c, "R"), names({I, PF, DC, SD, DC}));
  EXPECT_EQ(r.stats().transitions[DC][SD], 1u);
  EXPECT_EQ(r.stats().transitions[SD][DC], 1u);
}

// Every state the table lets request_preempted leave: INITIALIZED, ONBOARD_STAGED,
// ONBOARDING, PREFILLING, DECODING, SKIPPED_PREFILL, SKIPPED_DECODE.
TEST_F(Slots, PreemptFromEveryListedState) {
  ASSERT_EQ(r.match("i", own(1)).first, 0u);
  stage("os");
  prefill("pf", 2, 10, 16);
  decode("dc", 3, 20);
  prefill("sp", 4, 30, 16);
  decode("sd", 5, 40);
  r.step(r.meta({{"pf", 16, 8}, {"dc", 41, 1, {}, {8}}}));  // sp and sd skipped
  ASSERT_EQ(slot_state(r.c, "sp"), SP);
  ASSERT_EQ(slot_state(r.c, "sd"), SD);
  ASSERT_EQ(slot_state(r.c, "pf"), PF);
  onboard("ob", 50);  // its load planned, not yet in a step
  std::pair<const char *, uint32_t> from[] = {{"i", I},   {"os", OS}, {"ob", OB}, {"pf", PF},
                                              {"dc", DC}, {"sp", SP}, {"sd", SD}};
  for (auto [id, st] : from) {
    ASSERT_KVT_OK(kvt_connector_request_preempted(r.c, id));
    EXPECT_EQ(last(r.c, id, 2), names({st, PE})) << id;
    EXPECT_EQ(r.stats().transitions[st][PE], 1u) << id;
  }
  EXPECT_EQ(r.stats().preemptions, 7u);
  EXPECT_EQ(stats(r.m.get(), KVT_TIER_G2).active, 0u) << "a preempted slot keeps its pins";
}

// vLLM's reset_prefix_cache(reset_running_requests=True) preempts running requests between
// steps; the next schedule asks about them (they wait again) before its metadata carries
// preempted_req_ids. The question preempts them; the engine's request_preempted in the same
// step changes nothing, a later one for a running request is a preemption again.
TEST_F(Slots, MatchOnARunningSlotPreemptsIt) {
  prefill("R", 1, 1);  // its two full blocks stored in G2
  auto h = hashes_of(own(1));
  EXPECT_EQ(r.match("R", own(1)).first, 32u);
  EXPECT_EQ(history(r.c, "R"), names({I, PF, PE, OS}));
  EXPECT_EQ(r.stats().preemptions, 1u);
  ASSERT_KVT_OK(r.alloc("R", {7, 8, 9}, 32));
  ASSERT_KVT_OK(kvt_connector_request_preempted(r.c, "R"));
  EXPECT_EQ(slot_state(r.c, "R"), OB) << "the step's own request_preempted undid the onboard";
  EXPECT_EQ(r.stats().preemptions, 1u);
  r.step(r.meta({{"R", 32, 8}}), {}, r.counts(2, 2), [&] {
    EXPECT_TRUE(r.g1.holds(7, h[0]) && r.g1.holds(8, h[1]));
  });
  EXPECT_EQ(slot_state(r.c, "R"), PF);
  ASSERT_KVT_OK(kvt_connector_request_preempted(r.c, "R"));
  EXPECT_EQ(last(r.c, "R", 2), names({PF, PE}));
  ASSERT_KVT_OK(kvt_connector_request_preempted(r.c, "R"));  // told twice: nothing more
  EXPECT_EQ(r.stats().preemptions, 2u);
  EXPECT_EQ(r.finish("R"), 0);
  EXPECT_EQ(stats(r.m.get(), KVT_TIER_G2).active, 0u);
}

// vLLM's async scheduling schedules a decode step before its sampled token is known, and
// speculative decoding schedules drafts beyond the known tokens: both are taken, and a block
// is stored only once all of its tokens are known and computed.
TEST_F(Slots, ScheduledBeyondTheKnownTokens) {
  auto t = own(1);  // 40 tokens: blocks 0 and 1 full, block 2 holds 8
  auto h = hashes_of(t);
  ASSERT_EQ(r.match("R", t).first, 0u);
  ASSERT_KVT_OK(r.alloc("R", {1, 2, 3}, 0));
  r.step(r.meta({{"R", 0, 40}}), {{1, h[0]}, {2, h[1]}}, r.counts(2, 0));
  // 40 computed, 1 placeholder and 7 drafts scheduled: 48 tokens, block 2's only 8 known.
  r.step(r.meta({{"R", 40, 8}}));
  EXPECT_EQ(slot_state(r.c, "R"), PF);
  EXPECT_EQ(r.stats().stored_blocks, 2u) << "a block of unknown tokens was stored";
  // The sampled and accepted tokens arrive: block 2's 16 tokens are known, and computed.
  std::vector<uint32_t> more = token_range(50000, 8);
  auto full = concat(t, more);
  auto hf = hashes_of(full);
  r.step(r.meta({{"R", 48, 1, {4}, more}}), {{3, hf[2]}}, r.counts(3, 0));
  EXPECT_EQ(slot_state(r.c, "R"), DC);
  EXPECT_EQ(r.g2_holding(hf), 3u);
  // A decode step whose sampled token is not known yet stays DECODING.
  r.step(r.meta({{"R", 49, 1}}));
  EXPECT_EQ(slot_state(r.c, "R"), DC);
  EXPECT_EQ(r.stats().transitions[DC][DC], 1u);
  // Beyond the blocks the request holds is still refused.
  kvt_status st = KVT_OK;
  build_meta(r.c, {{"R", 49, 1000}}, &st);
  EXPECT_KVT(st, KVT_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(r.finish("R"), 0);
}

// vLLM's reset_connector_cache: nothing stored before the reset is served after it, not even
// what a store in flight at the reset brings.
TEST_F(Slots, ResetCacheServesNothingStoredBefore) {
  r.run_a();
  auto t = own(1);
  auto h = hashes_of(t);
  ASSERT_EQ(r.match("R", t).first, 0u);
  ASSERT_KVT_OK(r.alloc("R", {4, 5, 6}, 0));
  std::string meta = r.meta({{"R", 0, 40}});  // R's stores are in flight
  ASSERT_KVT_OK(kvt_connector_reset_cache(r.c));
  EXPECT_EQ(r.held(ha), 0u) << "A's blocks are still registered";
  r.step(meta, {{4, h[0]}, {5, h[1]}}, [&] { return r.stats().store_failures == 2; });
  EXPECT_EQ(r.g2_holding(h), 0u) << "a store in flight at the reset was registered";
  EXPECT_EQ(r.match("B", seed_b()).first, 0u);
  EXPECT_EQ(r.finish("R"), 0);
  EXPECT_EQ(r.finish("B"), 0);
  EXPECT_EQ(stats(r.m.get(), KVT_TIER_G2).active, 0u);
  EXPECT_KVT(kvt_manager_check(r.m.get()), KVT_OK);
  // Stored again after the reset, it is served again.
  r.run_a();
  EXPECT_EQ(r.match("B2", seed_b()).first, 32u);
  EXPECT_EQ(r.finish("B2"), 0);
}

// Requests named under their own salts (vLLM's cache_salt, LoRA...) share no block with
// other salts, and do with their own.
TEST_F(Slots, SaltedRequestsShareOnlyWithTheirSalt) {
  r.run_a();  // under the connector's salt
  uint64_t tenant = 0, n = 0;
  ASSERT_KVT_OK(kvt_hash_salt(&tenant, "tenant-1", 8));
  auto b = seed_b();
  int32_t async = 0;
  ASSERT_KVT_OK(kvt_connector_get_num_new_matched_tokens_salted(&n, &async, r.c, "T", tenant,
                                                                b.data(), b.size(), 0));
  EXPECT_EQ(n, 0u) << "another tenant's blocks were offered";
  ASSERT_KVT_OK(r.alloc("T", {4, 5, 6, 7}, 0));
  auto salted = [&](const std::vector<uint32_t> &tokens) {
    std::vector<uint64_t> out(tokens.size() / kPage);
    size_t need = 0;
    EXPECT_KVT(kvt_hash_tokens(out.data(), out.size(), &need, tenant, tokens.data(),
                               tokens.size(), kPage),
               KVT_OK);
    return out;
  };
  auto ht = salted(b);
  r.step(r.meta({{"T", 0, 52}}), {{4, ht[0]}, {5, ht[1]}, {6, ht[2]}}, r.counts(5, 0));
  EXPECT_EQ(r.g2_holding(ht), 3u);
  EXPECT_EQ(r.finish("T"), 0);
  ASSERT_KVT_OK(kvt_connector_get_num_new_matched_tokens_salted(&n, &async, r.c, "T2", tenant,
                                                                b.data(), b.size(), 0));
  EXPECT_EQ(n, 48u);
  EXPECT_EQ(r.match("U", b).first, 32u) << "the connector's salt serves A's two blocks only";
  EXPECT_EQ(r.finish("T2"), 0);
  EXPECT_EQ(r.finish("U"), 0);
}

// Every state but FINISHING and FINISHED finishes; with nothing outstanding it passes through
// FINISHING to FINISHED in the same call, and its id is unknown afterwards.
TEST_F(Slots, FinishFromEveryState) {
  ASSERT_EQ(r.match("i", own(1)).first, 0u);
  stage("os");
  prefill("pf", 2, 10, 16);
  decode("dc", 3, 20);
  prefill("sp", 4, 30, 16);
  decode("sd", 5, 40);
  prefill("pe", 6, 50, 16);
  r.step(r.meta({{"pf", 16, 8}, {"dc", 41, 1, {}, {8}}}));  // sp, sd and pe skipped
  ASSERT_KVT_OK(kvt_connector_request_preempted(r.c, "pe"));
  kvt_connector_stats before = r.stats();  // A finished from PREFILLING in stage()
  std::pair<const char *, uint32_t> from[] = {{"i", I},   {"os", OS}, {"pf", PF}, {"dc", DC},
                                              {"sp", SP}, {"sd", SD}, {"pe", PE}};
  for (auto [id, st] : from) {
    EXPECT_EQ(r.finish(id), 0) << id;
    EXPECT_EQ(last(r.c, id, 3), names({st, FG, FD})) << id;
    EXPECT_EQ(r.stats().transitions[st][FG], before.transitions[st][FG] + 1) << id;
    int32_t delay = -1;
    EXPECT_KVT(kvt_connector_request_finished(&delay, r.c, id), KVT_ERR_NOT_FOUND);
    EXPECT_KVT(kvt_connector_request_preempted(r.c, id), KVT_ERR_NOT_FOUND);
  }
  EXPECT_EQ(r.stats().transitions[FG][FD], before.transitions[FG][FD] + 7);
  EXPECT_EQ(stats(r.m.get(), KVT_TIER_G2).active, 0u);
  EXPECT_KVT(kvt_manager_check(r.m.get()), KVT_OK);
}

// An ONBOARDING slot whose loads are planned but not yet in any metadata: nothing is in
// flight, so it finishes at once, its pins drop, and no later metadata loads into its blocks.
TEST_F(Slots, FinishOnboardingBeforeItsLoadIsScheduled) {
  onboard("B", 4);
  EXPECT_EQ(r.finish("B"), 0);
  EXPECT_EQ(last(r.c, "B", 3), names({OB, FG, FD}));
  EXPECT_EQ(stats(r.m.get(), KVT_TIER_G2).active, 0u);
  r.step(r.meta({}));
  EXPECT_EQ(uint64_t(std::count(r.g1.block(4), r.g1.block(6), 0)), 2 * kBlock)
      << "a finished request's load was run";
  EXPECT_EQ(r.stats().loaded_blocks, 0u);
}

// FINISHING: stores of the request are in the metadata when it finishes. The engine keeps the
// blocks (delay_free 1); the worker's reports drain the stores, the slot becomes FINISHED and
// the worker lists it in finished_sending.
TEST_F(Slots, FinishingUntilItsStoresDrain) {
  auto t = own(1);
  auto h = hashes_of(t);
  ASSERT_EQ(r.match("R", t).first, 0u);
  ASSERT_KVT_OK(r.alloc("R", {1, 2, 3}, 0));
  std::string meta = r.meta({{"R", 0, 40}});
  EXPECT_EQ(r.finish("R"), 1);
  EXPECT_EQ(history(r.c, "R"), names({I, PF, FG}));
  ASSERT_KVT_OK(worker_step(r.c, r.g1, meta, {{1, h[0]}, {2, h[1]}}));
  EXPECT_EQ(slot_state(r.c, "R"), FG) << "FINISHED before any report";
  Finished f;
  EXPECT_TRUE(drain(r.c, r.c, &f, [&] { return f.sent("R") || r.stats().stored_blocks == 2; }));
  ASSERT_KVT_OK(kvt_connector_clear_connector_metadata(r.c));
  for (int i = 0; i < 3 && !f.sent("R"); ++i) {  // the next metadata tells the worker
    ASSERT_KVT_OK(worker_step(r.c, r.g1, r.meta({}), {}));
    drain(r.c, r.c, &f, [&] { return f.sent("R"); });
    ASSERT_KVT_OK(kvt_connector_clear_connector_metadata(r.c));
  }
  EXPECT_TRUE(f.sent("R"));
  EXPECT_EQ(history(r.c, "R"), names({I, PF, FG, FD}));
  EXPECT_EQ(r.stats().transitions[PF][FG], 1u);
  EXPECT_EQ(r.stats().transitions[FG][FD], 1u);
  EXPECT_EQ(r.stats().stored_blocks, 2u);
  EXPECT_EQ(r.g2_holding(h), 2u);
  EXPECT_EQ(stats(r.m.get(), KVT_TIER_G2).active, 0u);
}

// --- transitions the table does not list ---

// One slot in each live state, built through the API, and a step's metadata (with fin's
// stores) that the worker has not run yet:
//   ini INITIALIZED, stg ONBOARD_STAGED, onb ONBOARDING, pre PREFILLING, dec DECODING,
//   skp SKIPPED_PREFILL, skd SKIPPED_DECODE, pmt PREEMPTED, fin FINISHING.
struct Zoo : Slots {
  std::vector<std::string> ids = {"ini", "stg", "onb", "pre", "dec",
                                  "skp", "skd", "pmt", "fin"};
  std::vector<std::vector<uint32_t>> tok;  // by own() number
  std::string pending;                     // step 3's metadata, not yet run by the worker

  void SetUp() override {
    for (uint32_t k = 0; k < 8; ++k) tok.push_back(own(k));
    r.run_a();
    // Step 1: dec, skd (2 blocks each), skp, pre, pmt (first block) prefill.
    struct P {
      const char *id;
      uint32_t k, base;
      uint64_t n;
    } ps[] = {{"dec", 1, 30, 40}, {"skd", 2, 40, 40}, {"skp", 3, 35, 16},
              {"pre", 4, 25, 16}, {"pmt", 5, 45, 16}};
    std::vector<Sched> s1;
    Forward fwd;
    for (auto p : ps) {
      ASSERT_EQ(r.match(p.id, tok[p.k]).first, 0u);
      ASSERT_KVT_OK(r.alloc(p.id, {p.base, p.base + 1, p.base + 2}, 0));
      s1.push_back({p.id, 0, p.n});
      auto h = hashes_of(tok[p.k]);
      for (uint64_t i = 0; i < p.n / kPage; ++i) fwd.push_back({p.base + uint32_t(i), h[i]});
    }
    r.step(r.meta(s1), fwd, r.counts(9, 0));
    // Step 2: dec and skd decode, the others prefill on.
    r.step(r.meta({{"dec", 40, 1, {}, {1}}, {"skd", 40, 1, {}, {1}}, {"skp", 16, 4},
                   {"pre", 16, 4}, {"pmt", 16, 4}}));
    // Step 3: skp and skd skipped, fin prefills and is finished before the worker runs it.
    ASSERT_EQ(r.match("fin", tok[7]).first, 0u);
    ASSERT_KVT_OK(r.alloc("fin", {50, 51, 52}, 0));
    pending = r.meta({{"dec", 41, 1, {}, {2}}, {"pre", 20, 4}, {"pmt", 20, 4}, {"fin", 0, 40}});
    ASSERT_EQ(r.finish("fin"), 1);
    ASSERT_KVT_OK(kvt_connector_request_preempted(r.c, "pmt"));
    ASSERT_EQ(r.match("ini", tok[6]).first, 0u);
    ASSERT_KVT_OK(r.alloc("ini", {10, 11, 12}, 0));
    stage("stg");
    onboard("onb", 20);
    std::vector<uint32_t> want = {I, OS, OB, PF, DC, SP, SD, PE, FG};
    for (size_t i = 0; i < ids.size(); ++i) ASSERT_EQ(slot_state(r.c, ids[i]), want[i]) << ids[i];
  }

  // The worker runs step 3 and every slot goes on to its end, unharmed by what was refused.
  void finish_all() {
    auto h7 = hashes_of(tok[7]), h5 = hashes_of(tok[5]), h6 = hashes_of(tok[6]);
    r.step(pending, {{50, h7[0]}, {51, h7[1]}}, r.counts(11, 0));
    EXPECT_EQ(r.match("pmt", tok[5]).first, 16u);  // its first block was stored in step 1
    ASSERT_KVT_OK(r.alloc("pmt", {45, 46, 47}, 16));
    ASSERT_KVT_OK(r.alloc("stg", {15, 16, 17, 18}, 32));
    bool loaded = false;
    Finished f = r.step(
        r.meta({{"ini", 0, 40}, {"stg", 32, 8}, {"onb", 32, 20}, {"pre", 24, 4},
                {"dec", 42, 1, {}, {3}}, {"skp", 20, 4}, {"skd", 41, 1, {}, {3}},
                {"pmt", 16, 24}}),
        {{10, h6[0]}, {11, h6[1]}, {22, hb[2]}, {46, h5[1]}},
        [&] { return r.stats().stored_blocks == 15 && r.stats().loaded_blocks == 5; },
        [&] {
          loaded = r.g1.holds(15, ha[0]) && r.g1.holds(16, ha[1]) && r.g1.holds(20, ha[0]) &&
                   r.g1.holds(21, ha[1]) && r.g1.holds(45, h5[0]);
        });
    EXPECT_TRUE(loaded) << "a load lost or misplaced by a refused call";
    EXPECT_TRUE(f.load_errors.empty());
    std::vector<uint32_t> want = {PF, PF, PF, PF, DC, PF, DC, PF};
    for (size_t i = 0; i + 1 < ids.size(); ++i) {
      EXPECT_EQ(slot_state(r.c, ids[i]), want[i]) << ids[i];
      EXPECT_EQ(r.finish(ids[i]), 0) << ids[i];
    }
    for (int i = 0; i < 3 && slot_state(r.c, "fin") != FD; ++i) r.step(r.meta({}));
    EXPECT_EQ(history(r.c, "fin"), names({I, PF, FG, FD}));
    EXPECT_EQ(stats(r.m.get(), KVT_TIER_G2).active, 0u);
    EXPECT_KVT(kvt_manager_check(r.m.get()), KVT_OK);
  }
};

TEST_F(Zoo, AllocOnAScheduledOrFinishingSlot) {
  for (const char *id : {"pre", "dec", "skp", "skd", "fin"})
    EXPECT_CONN_REFUSED(r, ids, r.alloc(id, {60, 61, 62}, 0), KVT_ERR_STATE);
  EXPECT_CONN_REFUSED(r, ids, r.alloc("onb", {20, 21, 22, 23}, 32), KVT_ERR_STATE);
  finish_all();
}

TEST_F(Zoo, PreemptFinishing) {
  EXPECT_CONN_REFUSED(r, ids, kvt_connector_request_preempted(r.c, "fin"), KVT_ERR_STATE);
  finish_all();
}

TEST_F(Zoo, FinishTwice) {
  int32_t delay = -1;
  EXPECT_CONN_REFUSED(r, ids, kvt_connector_request_finished(&delay, r.c, "fin"), KVT_ERR_STATE);
  EXPECT_EQ(delay, -1);
  finish_all();
}

TEST_F(Zoo, MatchOnAFinishingSlot) {
  uint64_t n = 99;
  int32_t async = 9;
  auto t = tok[7];
  EXPECT_CONN_REFUSED(r, ids,
                      kvt_connector_get_num_new_matched_tokens(&n, &async, r.c, "fin", t.data(),
                                                               t.size(), 0),
                      KVT_ERR_STATE);
  EXPECT_EQ(n, 99u);
  EXPECT_EQ(async, 9);
  finish_all();
}

TEST_F(Zoo, ScheduleWhatCannotBeScheduled) {
  kvt_status s = KVT_OK;
  // FINISHING, next to a legal entry that must not be applied either.
  EXPECT_CONN_REFUSED(r, ids,
                      (build_meta(r.c, {{"dec", 42, 1, {}, {3}}, {"fin", 40, 1, {}, {9}}}, &s), s),
                      KVT_ERR_STATE);
  // ONBOARD_STAGED: the engine has not allocated its blocks.
  EXPECT_CONN_REFUSED(r, ids, (build_meta(r.c, {{"stg", 32, 20}}, &s), s), KVT_ERR_STATE);
  finish_all();
}
