// Bad input to the connector: unknown and finished ids, calls of the wrong half and out of
// order, bad block ids and token counts, metadata and reports that are truncated, corrupt,
// of another version or from other capacities, reports naming unknown batches, bad configs
// and layouts, NULL pointers. Each call fails with its status and a message of its own,
// changes no slot, and a request in flight beside it ("keep") finishes unharmed.
#include <climits>

#include "connector/metadata.hpp"
#include "connector_support.hpp"

using namespace kvt_conn_test;

namespace {

constexpr uint32_t I = KVT_SLOT_INITIALIZED, OS = KVT_SLOT_ONBOARD_STAGED,
                   OB = KVT_SLOT_ONBOARDING, PF = KVT_SLOT_PREFILLING, FG = KVT_SLOT_FINISHING,
                   FD = KVT_SLOT_FINISHED;

// A failing call on a connector that has no slots to compare (a worker, say): its status and
// a message of its own.
#define EXPECT_REFUSED_MSG(expr, want)                                                    \
  do {                                                                                    \
    kvt_hash_salt(nullptr, nullptr, 0); /* leaves a known message */                      \
    std::string stale_ = kvt_last_error();                                                \
    EXPECT_KVT(expr, want);                                                               \
    EXPECT_NE(stale_, kvt_last_error()) << #expr " set no message";                       \
  } while (0)

kvt_status bind_meta(kvt_connector *c, const std::string &b) {
  return kvt_connector_bind_connector_metadata(c, b.data(), b.size());
}
kvt_status report_to(kvt_connector *c, const std::string &b) {
  return kvt_connector_update_connector_output(c, b.data(), b.size());
}

// Request "keep" beside every bad call: seed 003's B after A, its load done and its first
// chunk computed. A's step's reports are kept (they name A's store batch).
struct ConnectorBadInput : ::testing::Test {
  Rig r;
  std::vector<uint64_t> ha = hashes_of(seed_a()), hb = hashes_of(seed_b());
  Finished a_done;
  std::vector<std::string> ids = {"keep"};

  void SetUp() override {
    ASSERT_NE(r.c, nullptr);
    ASSERT_EQ(r.match("A", seed_a()).first, 0u);
    ASSERT_KVT_OK(r.alloc("A", {1, 2, 3}, 0));
    a_done = r.step(r.meta({{"A", 0, 40}}), {{1, ha[0]}, {2, ha[1]}}, r.counts(2, 0));
    ASSERT_EQ(r.finish("A"), 0);
    ASSERT_EQ(r.match("keep", seed_b()).first, 32u);
    ASSERT_KVT_OK(r.alloc("keep", {4, 5, 6, 7}, 32));
    r.step(r.meta({{"keep", 32, 8}}), {}, r.counts(2, 2));
    ASSERT_EQ(slot_state(r.c, "keep"), PF);
  }

  // keep's second and last chunk: its metadata, then its step.
  std::string keep_meta() { return r.meta({{"keep", 40, 12}}); }
  void keep_step(const std::string &meta) {
    bool loaded = false;
    r.step(meta, {{6, hb[2]}}, r.counts(3, 2),
           [&] { loaded = r.g1.holds(4, ha[0]) && r.g1.holds(5, ha[1]); });
    EXPECT_TRUE(loaded) << "keep's loaded blocks changed";
  }
  // keep ends as if nothing had happened.
  void keep_done() {
    EXPECT_EQ(r.finish("keep"), 0);
    EXPECT_EQ(history(r.c, "keep"), names({I, OS, OB, PF, FG, FD}));
    EXPECT_EQ(r.g2_holding(hb), 3u);
    EXPECT_EQ(stats(r.m.get(), KVT_TIER_G2).active, 0u);
    EXPECT_KVT(kvt_manager_check(r.m.get()), KVT_OK);
  }
  void keep_finishes() {
    keep_step(keep_meta());
    keep_done();
  }
};

}  // namespace

TEST_F(ConnectorBadInput, UnknownRequestId) {
  int32_t delay = -1;
  uint32_t st = 0;
  kvt_status s = KVT_OK;
  EXPECT_CONN_REFUSED(r, ids, r.alloc("nope", {10, 11}, 0), KVT_ERR_NOT_FOUND);
  EXPECT_CONN_REFUSED(r, ids, kvt_connector_request_finished(&delay, r.c, "nope"),
                      KVT_ERR_NOT_FOUND);
  EXPECT_CONN_REFUSED(r, ids, kvt_connector_request_preempted(r.c, "nope"), KVT_ERR_NOT_FOUND);
  EXPECT_CONN_REFUSED(r, ids, kvt_connector_slot_state(&st, nullptr, nullptr, 0, r.c, "nope"),
                      KVT_ERR_NOT_FOUND);
  // Beside a good entry, which is not applied either.
  EXPECT_CONN_REFUSED(r, ids, (build_meta(r.c, {{"keep", 40, 12}, {"nope", 0, 16}}, &s), s),
                      KVT_ERR_NOT_FOUND);
  EXPECT_EQ(delay, -1);
  EXPECT_EQ(st, 0u);
  const char *unknown[] = {"nope"};
  EXPECT_KVT(kvt_connector_handle_preemptions(r.c, unknown, 1), KVT_OK);  // ignored
  keep_finishes();
}

TEST_F(ConnectorBadInput, FinishedRequestId) {
  int32_t delay = -1;
  kvt_status s = KVT_OK;
  EXPECT_CONN_REFUSED(r, ids, r.alloc("A", {10, 11, 12}, 0), KVT_ERR_NOT_FOUND);
  EXPECT_CONN_REFUSED(r, ids, kvt_connector_request_finished(&delay, r.c, "A"),
                      KVT_ERR_NOT_FOUND);
  EXPECT_CONN_REFUSED(r, ids, kvt_connector_request_preempted(r.c, "A"), KVT_ERR_NOT_FOUND);
  EXPECT_CONN_REFUSED(r, ids, (build_meta(r.c, {{"A", 40, 1, {}, {5}}}, &s), s),
                      KVT_ERR_NOT_FOUND);
  EXPECT_EQ(slot_state(r.c, "A"), FD) << "a finished slot stays queryable";
  keep_finishes();
}

TEST_F(ConnectorBadInput, CallsOfTheWrongHalf) {
  Rig sched(connector_config(KVT_ROLE_SCHEDULER));
  Rig work(connector_config(KVT_ROLE_WORKER));
  ASSERT_NE(sched.c, nullptr);
  ASSERT_NE(work.c, nullptr);
  std::string meta = sched.meta({});
  std::string report;
  {
    Finished f;
    ASSERT_KVT_OK(collect(work.c, &f, &report));
  }
  kvt_connector *s = sched.c, *w = work.c;
  EngineG1 g1;
  kvt_finished fin{};
  fin.struct_size = sizeof fin;
  const char *some[] = {"keep"};
  EXPECT_REFUSED_MSG(kvt_connector_register_kv_caches(s, &g1.layout, kGpuBlocks), KVT_ERR_STATE);
  EXPECT_REFUSED_MSG(bind_meta(s, meta), KVT_ERR_STATE);
  EXPECT_REFUSED_MSG(kvt_connector_clear_connector_metadata(s), KVT_ERR_STATE);
  EXPECT_REFUSED_MSG(kvt_connector_start_load_kv(s), KVT_ERR_STATE);
  EXPECT_REFUSED_MSG(kvt_connector_wait_for_layer_load(s, 0), KVT_ERR_STATE);
  EXPECT_REFUSED_MSG(kvt_connector_save_kv_layer(s, 0), KVT_ERR_STATE);
  EXPECT_REFUSED_MSG(kvt_connector_wait_for_save(s), KVT_ERR_STATE);
  EXPECT_REFUSED_MSG(kvt_connector_handle_preemptions(s, some, 1), KVT_ERR_STATE);
  EXPECT_REFUSED_MSG(kvt_connector_get_finished(&fin, s), KVT_ERR_STATE);

  uint64_t n = 0;
  int32_t async = 0, delay = 0;
  uint32_t st = 0;
  auto t = seed_b();
  const uint32_t blocks[] = {1, 2};
  const void *out = nullptr;
  size_t len = 0;
  kvt_connector_stats cs{};
  cs.struct_size = sizeof cs;
  EXPECT_REFUSED_MSG(
      kvt_connector_get_num_new_matched_tokens(&n, &async, w, "x", t.data(), t.size(), 0),
      KVT_ERR_STATE);
  EXPECT_REFUSED_MSG(kvt_connector_update_state_after_alloc(w, "x", blocks, 2, 0), KVT_ERR_STATE);
  EXPECT_REFUSED_MSG(kvt_connector_build_connector_meta(&out, &len, w, nullptr, 0),
                     KVT_ERR_STATE);
  EXPECT_REFUSED_MSG(report_to(w, report), KVT_ERR_STATE);
  EXPECT_REFUSED_MSG(kvt_connector_request_finished(&delay, w, "x"), KVT_ERR_STATE);
  EXPECT_REFUSED_MSG(kvt_connector_request_preempted(w, "x"), KVT_ERR_STATE);
  EXPECT_REFUSED_MSG(kvt_connector_slot_state(&st, nullptr, nullptr, 0, w, "x"), KVT_ERR_STATE);
  EXPECT_REFUSED_MSG(kvt_connector_stats_get(&cs, w), KVT_ERR_STATE);
  keep_finishes();
}

TEST_F(ConnectorBadInput, CallsOutOfOrder) {
  // Nothing bound.
  EXPECT_CONN_REFUSED(r, ids, kvt_connector_start_load_kv(r.c), KVT_ERR_STATE);
  EXPECT_CONN_REFUSED(r, ids, kvt_connector_wait_for_layer_load(r.c, 0), KVT_ERR_STATE);
  EXPECT_CONN_REFUSED(r, ids, kvt_connector_save_kv_layer(r.c, 0), KVT_ERR_STATE);
  EXPECT_CONN_REFUSED(r, ids, kvt_connector_wait_for_save(r.c), KVT_ERR_STATE);
  EXPECT_CONN_REFUSED(r, ids, kvt_connector_clear_connector_metadata(r.c), KVT_ERR_STATE);
  // Registered already; a second connector on the manager.
  EXPECT_CONN_REFUSED(r, ids, kvt_connector_register_kv_caches(r.c, &r.g1.layout, kGpuBlocks),
                      KVT_ERR_STATE);
  kvt_connector *second = nullptr;
  kvt_connector_config cc = connector_config();
  EXPECT_CONN_REFUSED(r, ids, kvt_connector_create(&second, r.m.get(), &cc), KVT_ERR_STATE);
  EXPECT_EQ(second, nullptr);

  // Bound before the engine registered its G1.
  {
    auto m2 = make(seed_manager_config());
    kvt_connector *c2 = nullptr;
    ASSERT_KVT_OK(kvt_connector_create(&c2, m2.get(), &cc));
    std::string meta2 = build_meta(c2, {});
    EXPECT_REFUSED_MSG(bind_meta(c2, meta2), KVT_ERR_STATE);
    kvt_connector_destroy(c2);
  }
  // keep's step, with bad calls in it: bound twice, waits before start_load_kv, layers out
  // of range.
  std::string meta = keep_meta();
  ASSERT_KVT_OK(bind_meta(r.c, meta));
  EXPECT_CONN_REFUSED(r, ids, bind_meta(r.c, meta), KVT_ERR_STATE);
  EXPECT_CONN_REFUSED(r, ids, kvt_connector_wait_for_layer_load(r.c, 0), KVT_ERR_STATE);
  ASSERT_KVT_OK(kvt_connector_start_load_kv(r.c));
  EXPECT_CONN_REFUSED(r, ids, kvt_connector_wait_for_layer_load(r.c, kLayers),
                      KVT_ERR_INVALID_ARGUMENT);
  for (uint32_t l = 0; l < kLayers; ++l) ASSERT_KVT_OK(kvt_connector_wait_for_layer_load(r.c, l));
  r.g1.write(6, hb[2]);
  EXPECT_CONN_REFUSED(r, ids, kvt_connector_save_kv_layer(r.c, kLayers),
                      KVT_ERR_INVALID_ARGUMENT);
  for (uint32_t l = 0; l < kLayers; ++l) ASSERT_KVT_OK(kvt_connector_save_kv_layer(r.c, l));
  ASSERT_KVT_OK(kvt_connector_wait_for_save(r.c));
  Finished f;
  EXPECT_TRUE(drain(r.c, r.c, &f, r.counts(3, 2)));
  ASSERT_KVT_OK(kvt_connector_clear_connector_metadata(r.c));
  keep_done();
}

TEST_F(ConnectorBadInput, BlockIds) {
  ids = {"keep", "x", "y", "z"};
  ASSERT_EQ(r.match("x", token_range(7000, 40)).first, 0u);
  EXPECT_CONN_REFUSED(r, ids, r.alloc("x", {8, uint32_t(kGpuBlocks), 9}, 0),
                      KVT_ERR_INVALID_ARGUMENT);
  // (UINT32_MAX is KVT_BLOCK_ID_NONE: the engine's null block, accepted)
  EXPECT_CONN_REFUSED(r, ids, r.alloc("x", {8, UINT32_MAX - 1, 9}, 0), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_CONN_REFUSED(r, ids, r.alloc("x", {6, 8, 9}, 0), KVT_ERR_INVALID_ARGUMENT);  // keep's
  EXPECT_CONN_REFUSED(r, ids, r.alloc("x", {8, 8, 9}, 0), KVT_ERR_INVALID_ARGUMENT);  // twice
  ASSERT_KVT_OK(r.alloc("x", {8, 9, 10}, 0));
  kvt_status s = KVT_OK;
  EXPECT_CONN_REFUSED(r, ids, (build_meta(r.c, {{"x", 0, 40, {100}}}, &s), s),
                      KVT_ERR_INVALID_ARGUMENT);
  EXPECT_CONN_REFUSED(r, ids, (build_meta(r.c, {{"x", 0, 40, {7}}}, &s), s),
                      KVT_ERR_INVALID_ARGUMENT);  // keep's
  EXPECT_CONN_REFUSED(r, ids, (build_meta(r.c, {{"keep", 40, 12, {8}}}, &s), s),
                      KVT_ERR_INVALID_ARGUMENT);  // x's

  // The engine's own prefix hit may share keep's blocks; a block y or z writes may not.
  ASSERT_EQ(r.match("y", seed_b(), 32).first, 0u);
  EXPECT_KVT(r.alloc("y", {4, 5, 11, 12}, 0), KVT_OK);
  ASSERT_EQ(r.match("z", seed_b(), 16).first, 16u);
  EXPECT_CONN_REFUSED(r, ids, r.alloc("z", {4, 5, 13, 14}, 0), KVT_ERR_INVALID_ARGUMENT);
  for (const char *id : {"x", "y", "z"}) EXPECT_EQ(r.finish(id), 0) << id;
  keep_finishes();
}

TEST_F(ConnectorBadInput, NumExternalTokens) {
  ids = {"keep", "s", "t"};
  ASSERT_EQ(r.match("s", seed_b()).first, 32u);
  ASSERT_EQ(r.match("t", token_range(7000, 40)).first, 0u);
  EXPECT_CONN_REFUSED(r, ids, r.alloc("s", {8, 9, 10, 11}, 16), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_CONN_REFUSED(r, ids, r.alloc("s", {8, 9, 10, 11}, 48), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_CONN_REFUSED(r, ids, r.alloc("s", {8}, 32), KVT_ERR_INVALID_ARGUMENT);  // too few
  EXPECT_CONN_REFUSED(r, ids, r.alloc("t", {12, 13, 14}, 16), KVT_ERR_INVALID_ARGUMENT);
  ASSERT_KVT_OK(r.alloc("s", {8, 9, 10, 11}, 32));
  EXPECT_EQ(r.finish("s"), 0);
  EXPECT_EQ(r.finish("t"), 0);
  keep_finishes();
}

TEST_F(ConnectorBadInput, RequestArguments) {
  uint64_t n = 99;
  int32_t async = 9;
  auto t = seed_b();
  std::string long_id(KVT_REQ_ID_MAX + 1, 'x'), max_id(KVT_REQ_ID_MAX, 'x');
  ids = {"keep", "fresh", max_id};
  auto gnnmt = [&](const char *id, const uint32_t *tokens, size_t count, uint64_t computed) {
    return kvt_connector_get_num_new_matched_tokens(&n, &async, r.c, id, tokens, count,
                                                    computed);
  };
  EXPECT_CONN_REFUSED(r, ids, gnnmt("", t.data(), t.size(), 0), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_CONN_REFUSED(r, ids, gnnmt(long_id.c_str(), t.data(), t.size(), 0),
                      KVT_ERR_INVALID_ARGUMENT);
  EXPECT_CONN_REFUSED(r, ids, gnnmt("fresh", t.data(), t.size(), t.size() + 1),
                      KVT_ERR_INVALID_ARGUMENT);
  EXPECT_CONN_REFUSED(r, ids, gnnmt("fresh", nullptr, 5, 0), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(n, 99u);
  EXPECT_EQ(async, 9);
  ASSERT_KVT_OK(gnnmt(max_id.c_str(), t.data(), t.size(), 0));
  ASSERT_KVT_OK(r.alloc(max_id, {8, 9, 10, 11}, 0));

  kvt_status s = KVT_OK;
  EXPECT_CONN_REFUSED(r, ids, (build_meta(r.c, {{"keep", 40, 12}, {"keep", 40, 12}}, &s), s),
                      KVT_ERR_INVALID_ARGUMENT);  // twice
  // Beyond its 52 tokens is a placeholder or a draft; beyond its 4 blocks is wrong.
  EXPECT_CONN_REFUSED(r, ids, (build_meta(r.c, {{"keep", 40, 25}}, &s), s),
                      KVT_ERR_INVALID_ARGUMENT);
  EXPECT_CONN_REFUSED(r, ids, (build_meta(r.c, {{"keep", 65, 0}}, &s), s),
                      KVT_ERR_INVALID_ARGUMENT);
  EXPECT_CONN_REFUSED(r, ids, (build_meta(r.c, {{"keep", 40, UINT64_MAX}}, &s), s),
                      KVT_ERR_INVALID_ARGUMENT);
  EXPECT_CONN_REFUSED(r, ids, (build_meta(r.c, {{max_id, 0, 52}, {"", 0, 1}}, &s), s),
                      KVT_ERR_INVALID_ARGUMENT);
  kvt_scheduled_request bad{};
  bad.req_id = "keep";
  bad.num_computed_tokens = 40;
  bad.num_scheduled_tokens = 12;
  const void *out = nullptr;
  size_t len = 0;
  auto build = [&](const kvt_scheduled_request *reqs, size_t count) {
    return kvt_connector_build_connector_meta(&out, &len, r.c, reqs, count);
  };
  EXPECT_CONN_REFUSED(r, ids, build(nullptr, 1), KVT_ERR_INVALID_ARGUMENT);
  bad.num_new_block_ids = 1;  // and no array
  EXPECT_CONN_REFUSED(r, ids, build(&bad, 1), KVT_ERR_INVALID_ARGUMENT);
  bad.num_new_block_ids = 0;
  bad.num_new_token_ids = 1;
  EXPECT_CONN_REFUSED(r, ids, build(&bad, 1), KVT_ERR_INVALID_ARGUMENT);
  bad.num_new_token_ids = 0;
  bad.req_id = nullptr;
  EXPECT_CONN_REFUSED(r, ids, build(&bad, 1), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(out, nullptr);
  EXPECT_EQ(r.finish(max_id), 0);
  keep_finishes();
}

// --- metadata and reports as bytes ---

namespace {

// The version byte's place (docs/CONNECTOR.md): after the array header and the magic string.
constexpr size_t kMetaVersionAt = 1 + 12, kReportVersionAt = 1 + 14;

}  // namespace

TEST_F(ConnectorBadInput, MetadataBytes) {
  std::string meta = keep_meta();
  ASSERT_GT(meta.size(), kMetaVersionAt);
  ASSERT_EQ(uint8_t(meta[kMetaVersionAt]), 2u) << "the format moved: see docs/CONNECTOR.md";
  for (size_t len = 0; len < meta.size(); ++len)
    EXPECT_CONN_REFUSED(r, ids, bind_meta(r.c, meta.substr(0, len)), KVT_ERR_CORRUPT);
  EXPECT_CONN_REFUSED(r, ids, bind_meta(r.c, meta + '\0'), KVT_ERR_CORRUPT);  // trailing bytes
  EXPECT_CONN_REFUSED(r, ids, bind_meta(r.c, std::string(64, '\xc1')), KVT_ERR_CORRUPT);
  std::string v1 = meta, magic = meta, header = meta, report = a_done.reports.back();
  v1[kMetaVersionAt] = 1;
  EXPECT_CONN_REFUSED(r, ids, bind_meta(r.c, v1), KVT_ERR_CORRUPT);
  EXPECT_NE(std::string(kvt_last_error()).find("version"), std::string::npos) << kvt_last_error();
  magic[3] ^= 0x20;
  EXPECT_CONN_REFUSED(r, ids, bind_meta(r.c, magic), KVT_ERR_CORRUPT);
  header[0] = char(uint8_t(header[0]) - 1);  // an array of 8
  EXPECT_CONN_REFUSED(r, ids, bind_meta(r.c, header), KVT_ERR_CORRUPT);
  EXPECT_CONN_REFUSED(r, ids, bind_meta(r.c, report), KVT_ERR_CORRUPT);  // a report is no metadata
  EXPECT_CONN_REFUSED(r, ids, kvt_connector_bind_connector_metadata(r.c, nullptr, 8),
                      KVT_ERR_INVALID_ARGUMENT);

  // Well formed, but not for this worker: another G2 capacity; a G1 block id beyond the
  // engine's 100; a slot beyond G2; a tier that is not G2 or G3.
  {
    Rig other(connector_config(KVT_ROLE_SCHEDULER), seed_manager_config(40));
    EXPECT_CONN_REFUSED(r, ids, bind_meta(r.c, other.meta({})), KVT_ERR_CORRUPT);
  }
  kvt::conn::Meta m;
  ASSERT_KVT_OK(kvt::conn::decode(&m, meta.data(), meta.size()));
  ASSERT_EQ(m.stores.size(), 1u) << "keep's step stores its third block";
  ASSERT_EQ(m.stores[0].ops.size(), 1u);
  kvt::conn::Meta bad = m;
  bad.stores[0].ops[0].g1 = uint32_t(kGpuBlocks);
  EXPECT_CONN_REFUSED(r, ids, bind_meta(r.c, kvt::conn::encode(bad)), KVT_ERR_CORRUPT);
  bad = m;
  bad.stores[0].ops[0].slot = uint32_t(m.shape.g2_blocks);
  EXPECT_CONN_REFUSED(r, ids, bind_meta(r.c, kvt::conn::encode(bad)), KVT_ERR_CORRUPT);
  bad = m;
  bad.stores[0].ops[0].tier = KVT_TIER_G1;
  EXPECT_CONN_REFUSED(r, ids, bind_meta(r.c, kvt::conn::encode(bad)), KVT_ERR_CORRUPT);

  keep_step(meta);  // binds meta: the refused binds bound nothing
  keep_done();
}

TEST_F(ConnectorBadInput, ReportBytes) {
  std::string report;
  for (const auto &rep : a_done.reports)
    if (rep.size() > report.size()) report = rep;  // the one naming A's store batch
  ASSERT_GT(report.size(), kReportVersionAt);
  ASSERT_EQ(uint8_t(report[kReportVersionAt]), 2u) << "the format moved: see docs/CONNECTOR.md";
  for (size_t len = 0; len < report.size(); ++len)
    EXPECT_CONN_REFUSED(r, ids, report_to(r.c, report.substr(0, len)), KVT_ERR_CORRUPT);
  EXPECT_CONN_REFUSED(r, ids, report_to(r.c, report + '\0'), KVT_ERR_CORRUPT);
  EXPECT_CONN_REFUSED(r, ids, report_to(r.c, std::string(64, '\xc1')), KVT_ERR_CORRUPT);
  std::string v1 = report;
  v1[kReportVersionAt] = 1;
  EXPECT_CONN_REFUSED(r, ids, report_to(r.c, v1), KVT_ERR_CORRUPT);
  EXPECT_CONN_REFUSED(r, ids, kvt_connector_update_connector_output(r.c, nullptr, 8),
                      KVT_ERR_INVALID_ARGUMENT);
  kvt::conn::Report other;
  ASSERT_KVT_OK(kvt::conn::decode(&other, report.data(), report.size()));
  other.shape.g2_blocks = 40;
  EXPECT_CONN_REFUSED(r, ids, report_to(r.c, kvt::conn::encode(other)), KVT_ERR_CORRUPT);
  ASSERT_KVT_OK(kvt::conn::decode(&other, report.data(), report.size()));
  other.shape.world_size = 2;  // a worker of another world
  other.rank = 1;
  EXPECT_CONN_REFUSED(r, ids, report_to(r.c, kvt::conn::encode(other)), KVT_ERR_CORRUPT);
  EXPECT_NE(std::string(kvt_last_error()).find("2 workers"), std::string::npos)
      << kvt_last_error();
  keep_finishes();
}

// A report naming a batch the scheduler does not know (already acknowledged, never issued,
// named twice, or of the other direction) is refused whole: the known batch beside it is not
// acknowledged either.
TEST_F(ConnectorBadInput, ReportNamingUnknownBatches) {
  size_t refused = 0;
  for (const auto &rep : a_done.reports) {  // A's batches are acknowledged already
    SlotSnapshot before(r.c, ids);
    kvt_status s = report_to(r.c, rep);
    EXPECT_TRUE(s == KVT_OK || s == KVT_ERR_INVALID_ARGUMENT) << kvt_status_str(s);
    refused += s == KVT_ERR_INVALID_ARGUMENT;
    EXPECT_TRUE(SlotSnapshot(r.c, ids) == before);
  }
  EXPECT_GE(refused, 1u) << "a replayed report was accepted";

  std::string meta = keep_meta();
  kvt::conn::Meta m;
  ASSERT_KVT_OK(kvt::conn::decode(&m, meta.data(), meta.size()));
  ASSERT_EQ(m.stores.size(), 1u);
  uint64_t known = m.stores[0].id;
  ASSERT_KVT_OK(worker_step(r.c, r.g1, meta, {{6, hb[2]}}));  // its report is not fed yet
  kvt::conn::Report rep;
  rep.shape = m.shape;
  rep.stores = {{known, {}}, {known + 1000, {}}};
  EXPECT_CONN_REFUSED(r, ids, report_to(r.c, kvt::conn::encode(rep)), KVT_ERR_INVALID_ARGUMENT);
  rep.stores = {{known, {}}, {known, {}}};
  EXPECT_CONN_REFUSED(r, ids, report_to(r.c, kvt::conn::encode(rep)), KVT_ERR_INVALID_ARGUMENT);
  rep.stores = {{known, {{1, KVT_ERR_IO}}}};  // the batch has one copy
  EXPECT_CONN_REFUSED(r, ids, report_to(r.c, kvt::conn::encode(rep)), KVT_ERR_INVALID_ARGUMENT);
  rep.stores = {};
  rep.loads = {{known, {}}};  // a store named as a load
  EXPECT_CONN_REFUSED(r, ids, report_to(r.c, kvt::conn::encode(rep)), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(r.stats().stored_blocks, 2u);

  Finished f;
  EXPECT_TRUE(drain(r.c, r.c, &f, r.counts(3, 2)));
  ASSERT_KVT_OK(kvt_connector_clear_connector_metadata(r.c));
  keep_done();
}

// --- configs and layouts ---

TEST_F(ConnectorBadInput, Config) {
  auto m2 = make(seed_manager_config());
  auto none = make(seed_manager_config(0, 0));  // neither G2 nor G3
  struct Bad {
    const char *what;
    void (*edit)(kvt_connector_config &);
  } bads[] = {
      {"struct_size", [](kvt_connector_config &c) { c.struct_size = 8; }},
      {"struct_size", [](kvt_connector_config &c) { c.struct_size += 8; }},
      {"role", [](kvt_connector_config &c) { c.role = 0; }},
      {"role", [](kvt_connector_config &c) { c.role = 4; }},
      {"offload", [](kvt_connector_config &c) { c.offload = 2; }},
      {"store_tier", [](kvt_connector_config &c) { c.store_tier = KVT_TIER_G1; }},
      {"store_tier", [](kvt_connector_config &c) { c.store_tier = 4; }},
      {"store_tier", [](kvt_connector_config &c) { c.store_tier = KVT_TIER_G3; }},  // no G3
      {"load_async", [](kvt_connector_config &c) { c.load_async = 2; }},
      {"reserved", [](kvt_connector_config &c) { c.reserved = 1; }},
      {"num_gpu_blocks", [](kvt_connector_config &c) { c.num_gpu_blocks = uint64_t{1} << 40; }},
  };
  for (const Bad &b : bads) {
    kvt_connector_config cc = connector_config();
    b.edit(cc);
    kvt_connector *c = reinterpret_cast<kvt_connector *>(0x1);
    EXPECT_REFUSED_MSG(kvt_connector_create(&c, m2.get(), &cc), KVT_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(kvt_last_error()).find(b.what), std::string::npos)
        << b.what << ": " << kvt_last_error();
    EXPECT_EQ(c, reinterpret_cast<kvt_connector *>(0x1)) << b.what;
  }
  kvt_connector *c = nullptr;
  kvt_connector_config cc = connector_config(KVT_ROLE_SCHEDULER);
  EXPECT_REFUSED_MSG(kvt_connector_create(&c, none.get(), &cc), KVT_ERR_INVALID_ARGUMENT);
  cc = connector_config();
  EXPECT_REFUSED_MSG(kvt_connector_create(nullptr, m2.get(), &cc), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_REFUSED_MSG(kvt_connector_create(&c, nullptr, &cc), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_REFUSED_MSG(kvt_connector_create(&c, m2.get(), nullptr), KVT_ERR_INVALID_ARGUMENT);
  // The refused configs left m2 without a connector.
  ASSERT_KVT_OK(kvt_connector_create(&c, m2.get(), &cc));
  kvt_connector_destroy(c);
  keep_finishes();
}

TEST_F(ConnectorBadInput, KvCacheLayout) {
  auto m2 = make(seed_manager_config());
  kvt_connector_config cc = connector_config(KVT_ROLE_WORKER);
  struct Bad {
    const char *what;
    void (*edit)(EngineG1 &, kvt_g1_layout &);
  } bads[] = {
      {"struct_size", [](EngineG1 &, kvt_g1_layout &l) { l.struct_size = 4; }},
      {"memory", [](EngineG1 &, kvt_g1_layout &l) { l.memory = 7; }},
      {"reserved", [](EngineG1 &, kvt_g1_layout &l) { l.reserved = 1; }},
      {"bases", [](EngineG1 &, kvt_g1_layout &l) { l.bases = nullptr; }},
      {"strides", [](EngineG1 &, kvt_g1_layout &l) { l.strides = nullptr; }},
      {"bases[2]", [](EngineG1 &g, kvt_g1_layout &) { g.bases[2] = nullptr; }},
      {"strides[1]", [](EngineG1 &g, kvt_g1_layout &) { g.strides[1] = kChunk - 1; }},
      {"layout", [](EngineG1 &, kvt_g1_layout &) {}},  // with num_blocks 0 below
  };
  for (const Bad &b : bads) {
    SCOPED_TRACE(b.what);
    kvt_connector *w = nullptr;  // a fresh worker for each: a refused layout registers nothing
    ASSERT_KVT_OK(kvt_connector_create(&w, m2.get(), &cc));
    EngineG1 g;
    kvt_g1_layout l = g.layout;
    b.edit(g, l);
    uint64_t blocks = std::string(b.what) == "layout" ? 0 : kGpuBlocks;
    EXPECT_REFUSED_MSG(kvt_connector_register_kv_caches(w, &l, blocks), KVT_ERR_INVALID_ARGUMENT);
    EXPECT_REFUSED_MSG(kvt_connector_register_kv_caches(w, nullptr, kGpuBlocks),
                       KVT_ERR_INVALID_ARGUMENT);
    // The refused layouts left the worker unregistered.
    EngineG1 good;
    EXPECT_KVT(kvt_connector_register_kv_caches(w, &good.layout, kGpuBlocks), KVT_OK);
    kvt_connector_destroy(w);
  }
  keep_finishes();
}

TEST_F(ConnectorBadInput, NullPointers) {
  uint64_t n = 0;
  int32_t async = 0, delay = 0;
  uint32_t st = 0;
  auto t = token_range(7000, 40);
  const uint32_t blocks[] = {8, 9, 10};
  const void *out = nullptr;
  size_t len = 0;
  kvt_connector_stats cs{};
  cs.struct_size = sizeof cs;
  kvt_finished fin{};
  fin.struct_size = sizeof fin;
  std::string meta = r.meta({{"keep", 40, 12}});
  const char *some[] = {"keep"}, *null_id[] = {nullptr};
  ids = {"keep", "new"};
  const int32_t kArg = KVT_ERR_INVALID_ARGUMENT;

  // No connector.
  EXPECT_CONN_REFUSED(r, ids,
                      kvt_connector_get_num_new_matched_tokens(&n, &async, nullptr, "new",
                                                               t.data(), t.size(), 0),
                      kArg);
  EXPECT_CONN_REFUSED(r, ids, kvt_connector_update_state_after_alloc(nullptr, "keep", blocks, 3, 0),
                      kArg);
  EXPECT_CONN_REFUSED(r, ids, kvt_connector_build_connector_meta(&out, &len, nullptr, nullptr, 0),
                      kArg);
  EXPECT_CONN_REFUSED(r, ids, report_to(nullptr, a_done.reports.back()), kArg);
  EXPECT_CONN_REFUSED(r, ids, kvt_connector_request_finished(&delay, nullptr, "keep"), kArg);
  EXPECT_CONN_REFUSED(r, ids, kvt_connector_request_preempted(nullptr, "keep"), kArg);
  EXPECT_CONN_REFUSED(r, ids, kvt_connector_slot_state(&st, nullptr, nullptr, 0, nullptr, "keep"),
                      kArg);
  EXPECT_CONN_REFUSED(r, ids, kvt_connector_stats_get(&cs, nullptr), kArg);
  EXPECT_CONN_REFUSED(r, ids, kvt_connector_register_kv_caches(nullptr, &r.g1.layout, 100), kArg);
  EXPECT_CONN_REFUSED(r, ids, bind_meta(nullptr, meta), kArg);
  EXPECT_CONN_REFUSED(r, ids, kvt_connector_clear_connector_metadata(nullptr), kArg);
  EXPECT_CONN_REFUSED(r, ids, kvt_connector_start_load_kv(nullptr), kArg);
  EXPECT_CONN_REFUSED(r, ids, kvt_connector_wait_for_layer_load(nullptr, 0), kArg);
  EXPECT_CONN_REFUSED(r, ids, kvt_connector_save_kv_layer(nullptr, 0), kArg);
  EXPECT_CONN_REFUSED(r, ids, kvt_connector_wait_for_save(nullptr), kArg);
  EXPECT_CONN_REFUSED(r, ids, kvt_connector_handle_preemptions(nullptr, some, 1), kArg);
  EXPECT_CONN_REFUSED(r, ids, kvt_connector_get_finished(&fin, nullptr), kArg);
  kvt_event ev[4];
  EXPECT_EQ(kvt_connector_drain_events(nullptr, ev, 4), 0u);
  EXPECT_EQ(kvt_connector_drain_events(r.c, nullptr, 4), 0u);
  kvt_connector_destroy(nullptr);

  // No out-parameter.
  EXPECT_CONN_REFUSED(r, ids,
                      kvt_connector_get_num_new_matched_tokens(nullptr, &async, r.c, "new",
                                                               t.data(), t.size(), 0),
                      kArg);
  EXPECT_CONN_REFUSED(r, ids, kvt_connector_build_connector_meta(nullptr, &len, r.c, nullptr, 0),
                      kArg);
  EXPECT_CONN_REFUSED(r, ids, kvt_connector_build_connector_meta(&out, nullptr, r.c, nullptr, 0),
                      kArg);
  EXPECT_CONN_REFUSED(r, ids, kvt_connector_stats_get(nullptr, r.c), kArg);
  EXPECT_CONN_REFUSED(r, ids, kvt_connector_get_finished(nullptr, r.c), kArg);
  uint32_t hist[4];
  size_t hn = 0;
  EXPECT_CONN_REFUSED(r, ids, kvt_connector_slot_state(&st, nullptr, &hn, 4, r.c, "keep"), kArg);
  EXPECT_KVT(kvt_connector_slot_state(nullptr, hist, nullptr, 4, r.c, "keep"), KVT_OK);

  // No request id, or an array without its elements.
  EXPECT_CONN_REFUSED(r, ids,
                      kvt_connector_get_num_new_matched_tokens(&n, &async, r.c, nullptr,
                                                               t.data(), t.size(), 0),
                      kArg);
  EXPECT_CONN_REFUSED(r, ids, kvt_connector_update_state_after_alloc(r.c, nullptr, blocks, 3, 0),
                      kArg);
  EXPECT_CONN_REFUSED(r, ids, kvt_connector_request_finished(&delay, r.c, nullptr), kArg);
  EXPECT_CONN_REFUSED(r, ids, kvt_connector_request_preempted(r.c, nullptr), kArg);
  EXPECT_CONN_REFUSED(r, ids, kvt_connector_slot_state(&st, nullptr, nullptr, 0, r.c, nullptr),
                      kArg);
  ASSERT_EQ(r.match("new", t).first, 0u);
  EXPECT_CONN_REFUSED(r, ids, kvt_connector_update_state_after_alloc(r.c, "new", nullptr, 3, 0),
                      kArg);
  EXPECT_CONN_REFUSED(r, ids, kvt_connector_handle_preemptions(r.c, nullptr, 1), kArg);
  EXPECT_CONN_REFUSED(r, ids, kvt_connector_handle_preemptions(r.c, null_id, 1), kArg);
  EXPECT_STREQ(kvt_slot_state_str(0), "KVT_SLOT_UNKNOWN");
  EXPECT_STREQ(kvt_slot_state_str(11), "KVT_SLOT_UNKNOWN");
  EXPECT_EQ(r.finish("new"), 0);
  keep_step(meta);
  keep_done();
}

// The header names no out-parameter of these two optional: the engine must learn whether the
// load is asynchronous, and whether to keep the request's blocks.
// out_load_async is optional (the header says so); out_delay_free is not: without it the
// engine could not learn that it must keep the blocks.
TEST_F(ConnectorBadInput, NullLoadAsyncIsOptionalNullDelayFreeIsRefused) {
  uint64_t n = 99;
  auto t = token_range(7000, 40);
  ids = {"keep", "new"};
  EXPECT_KVT(kvt_connector_get_num_new_matched_tokens(&n, nullptr, r.c, "new", t.data(),
                                                      t.size(), 0),
             KVT_OK);
  EXPECT_EQ(n, 0u);
  EXPECT_CONN_REFUSED(r, ids, kvt_connector_request_finished(nullptr, r.c, "keep"),
                      KVT_ERR_INVALID_ARGUMENT);
  if (slot_state(r.c, "new") != 0) r.finish("new");
  if (slot_state(r.c, "keep") == KVT_SLOT_PREFILLING) keep_finishes();
}
