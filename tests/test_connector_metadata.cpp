// The connector's wire format (docs/CONNECTOR.md, "Wire format"), on the codec compiled into
// this binary: round trips, the documented bytes, and bytes that must be refused.
#include <gtest/gtest.h>

#include <msgpack.hpp>

#include <string>
#include <vector>

#include "common/error.hpp"
#include "connector/metadata.hpp"

namespace kvt::conn {
namespace {

std::string bytes(std::initializer_list<uint8_t> b) { return std::string(b.begin(), b.end()); }

Meta full_meta() {
  Meta m;
  m.shape = {16, 50, 1u << 20, 2};
  m.step = 1ull << 40;
  m.async_load = true;
  m.lazy_stores = {{7, "lazy", {{99, KVT_TIER_G2, 49, 0xfedcba9876543210ull, 0}}}};
  m.loads = {{1, "req-A", {{3, KVT_TIER_G2, 0, 11, 0}, {4, KVT_TIER_G3, 1u << 19, 12, 11}}},
             {2, std::string(KVT_REQ_ID_MAX, 'x'), {}}};
  // 16 ops: an array 16 header.
  Batch big{UINT64_MAX, std::string(40, 'b'), {}};
  for (uint32_t i = 0; i < 16; ++i)
    big.ops.push_back({UINT32_MAX - i, KVT_TIER_G3, i * 1000, ~uint64_t(i), i});
  m.stores = {big};
  m.finished = {"req-A", std::string(32, 'f')};
  return m;
}

Report full_report() {
  Report r;
  r.shape = {16, 50, 1u << 20, KVT_MAX_WORLD_SIZE};
  r.rank = KVT_MAX_WORLD_SIZE - 1;
  r.loads = {{1, {{0, KVT_ERR_CORRUPT}, {UINT32_MAX, KVT_ERR_IO}}}, {2, {}}};
  r.stores = {{UINT64_MAX, {{3, INT32_MIN}}}};
  r.finished_sending = {"req-A"};
  r.finished_recving = {std::string(KVT_REQ_ID_MAX, 'r'), "b"};
  return r;
}

// The invariants every decoded message holds (metadata.hpp).
bool ok_id(const std::string &id) {
  return !id.empty() && id.size() <= KVT_REQ_ID_MAX && id.find('\0') == std::string::npos;
}
void expect_valid(const Meta &m) {
  for (const auto *list : {&m.lazy_stores, &m.loads, &m.stores})
    for (const Batch &b : *list) {
      EXPECT_TRUE(ok_id(b.req_id));
      for (const CopyOp &op : b.ops) {
        ASSERT_TRUE(op.tier == KVT_TIER_G2 || op.tier == KVT_TIER_G3);
        EXPECT_LT(op.slot, op.tier == KVT_TIER_G2 ? m.shape.g2_blocks : m.shape.g3_blocks);
      }
    }
  for (const std::string &id : m.finished) EXPECT_TRUE(ok_id(id));
}
void expect_valid(const Report &r) {
  for (const auto *list : {&r.loads, &r.stores})
    for (const Done &d : *list)
      for (const Failure &f : d.failed) EXPECT_LT(f.status, 0);
  for (const std::string &id : r.finished_sending) EXPECT_TRUE(ok_id(id));
  for (const std::string &id : r.finished_recving) EXPECT_TRUE(ok_id(id));
}

// Decodes, expecting KVT_ERR_CORRUPT with a message containing each of `words`; *out must
// be left as it was.
template <class T>
void expect_corrupt(const std::string &b, std::initializer_list<const char *> words = {}) {
  T out;
  out.shape.page_size = 12345;
  ASSERT_EQ(decode(&out, b.data(), b.size()), KVT_ERR_CORRUPT) << "decoded " << b.size()
                                                               << " bytes";
  EXPECT_EQ(out.shape.page_size, 12345u) << "a refused decode wrote its output";
  const std::string msg = last_error();
  for (const char *w : words) EXPECT_NE(msg.find(w), std::string::npos) << msg;
}

template <class T>
T round_trip(const T &v) {
  const std::string b = encode(v);
  T out;
  EXPECT_EQ(decode(&out, b.data(), b.size()), KVT_OK) << last_error();
  EXPECT_EQ(encode(out), b);
  return out;
}

TEST(ConnectorMetadata, MetaRoundTrips) {
  EXPECT_EQ(round_trip(full_meta()), full_meta());
  EXPECT_EQ(round_trip(Meta{}), Meta{});
}

TEST(ConnectorMetadata, ReportRoundTrips) {
  EXPECT_EQ(round_trip(full_report()), full_report());
  EXPECT_EQ(round_trip(Report{}), Report{});
}

// The examples of docs/CONNECTOR.md, byte for byte: a change here is a format change and
// needs a new kFormatVersion.
TEST(ConnectorMetadata, EncodesTheDocumentedBytes) {
  Meta m;
  m.shape = {16, 4, 0};
  m.step = 1;
  m.loads = {{1, "A", {{3, KVT_TIER_G2, 0, 0x1234, 0}}}};
  m.finished = {"B"};
  EXPECT_EQ(encode(m), bytes({0x99, 0xab, 'k', 'v', 't', 'i', 'e', 'r', '-', 'm', 'e', 't', 'a',
                              0x02, 0x94, 0x10, 0x04, 0x00, 0x01, 0x01, 0xc2, 0x90, 0x91, 0x93,
                              0x01, 0xa1, 'A', 0x91, 0x95, 0x03, 0x02, 0x00, 0xcd, 0x12, 0x34,
                              0x00, 0x90, 0x91, 0xa1, 'B'}));
  Report r;
  r.shape = {16, 4, 0, 2};
  r.rank = 1;
  r.loads = {{1, {{0, KVT_ERR_CORRUPT}}}};
  r.finished_recving = {"A"};
  EXPECT_EQ(encode(r), bytes({0x98, 0xad, 'k', 'v', 't', 'i', 'e', 'r', '-', 'r', 'e', 'p', 'o',
                              'r', 't', 0x02, 0x94, 0x10, 0x04, 0x00, 0x02, 0x91, 0x92, 0x01,
                              0x91, 0x92, 0x00, 0xf8, 0x90, 0x90, 0x91, 0xa1, 'A', 0x01}));
}

TEST(ConnectorMetadata, EveryTruncationIsCorrupt) {
  for (const std::string &b : {encode(full_meta()), encode(Meta{})})
    for (size_t n = 0; n < b.size(); ++n) expect_corrupt<Meta>(b.substr(0, n), {"truncated"});
  for (const std::string &b : {encode(full_report()), encode(Report{})})
    for (size_t n = 0; n < b.size(); ++n) expect_corrupt<Report>(b.substr(0, n), {"truncated"});
}

TEST(ConnectorMetadata, TrailingBytesAreCorrupt) {
  expect_corrupt<Meta>(encode(full_meta()) + '\0', {"1 trailing byte(s)"});
  expect_corrupt<Report>(encode(Report{}) + encode(Report{}), {"trailing byte(s)"});
}

// Every byte of a valid message, replaced by values that change its type, length or value:
// the result is refused with KVT_ERR_CORRUPT, or it decodes to a message whose invariants
// hold and which encodes and decodes again to itself. Never a crash (ASan, valgrind in CI).
template <class T>
void corrupt_each_byte(const std::string &good) {
  size_t refused = 0, accepted = 0;
  for (size_t i = 0; i < good.size(); ++i) {
    const uint8_t was = uint8_t(good[i]);
    for (uint8_t v : {uint8_t(was ^ 0x01), uint8_t(was ^ 0x10), uint8_t(was ^ 0x80),
                      uint8_t(was + 1), uint8_t(was - 1), uint8_t(0x00), uint8_t(0xc1),
                      uint8_t(0xc0), uint8_t(0xdd), uint8_t(0xdb), uint8_t(0xff)}) {
      if (v == was) continue;
      std::string b = good;
      b[i] = char(v);
      T out;
      const kvt_status s = decode(&out, b.data(), b.size());
      if (s != KVT_OK) {
        ASSERT_EQ(s, KVT_ERR_CORRUPT) << "byte " << i << " = " << unsigned(v);
        ++refused;
        continue;
      }
      ++accepted;
      expect_valid(out);
      EXPECT_EQ(round_trip(out), out) << "byte " << i << " = " << unsigned(v);
    }
  }
  // Both outcomes happen: a hash's byte is just another hash, a header's is not.
  EXPECT_GT(refused, 0u);
  EXPECT_GT(accepted, 0u);
}

TEST(ConnectorMetadata, EverySingleByteCorruptionIsRefusedOrValid) {
  corrupt_each_byte<Meta>(encode(full_meta()));
  corrupt_each_byte<Report>(encode(full_report()));
}

// Builds messages that the encoder never writes.
struct Raw {
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> pk{buf};
  Raw &arr(uint32_t n) { return pk.pack_array(n), *this; }
  Raw &str(const std::string &s) {
    pk.pack_str(uint32_t(s.size()));
    pk.pack_str_body(s.data(), uint32_t(s.size()));
    return *this;
  }
  Raw &u(uint64_t v) { return pk.pack_uint64(v), *this; }
  Raw &i(int64_t v) { return pk.pack_int64(v), *this; }
  Raw &shape(uint64_t g2 = 8, uint64_t g3 = 8, uint64_t world = 1) {
    return arr(4).u(16).u(g2).u(g3).u(world);
  }
  Raw &meta_head(uint64_t version = kFormatVersion, uint32_t fields = 9) {
    arr(fields).str("kvtier-meta").u(version).shape().u(1);  // ... step 1,
    pk.pack_false();                                         // async_load false
    return *this;
  }
  Raw &report_head(uint64_t world = 1) {
    return arr(8).str("kvtier-report").u(kFormatVersion).shape(8, 8, world);
  }
  std::string get() const { return std::string(buf.data(), buf.size()); }
};

// A Meta whose only batch is a load of `req` with one op; the rest empty.
std::string meta_with(const std::string &req, uint64_t tier, uint64_t slot) {
  Raw r;
  r.meta_head().arr(0).arr(1).arr(3).u(5).str(req).arr(1).arr(5).u(0).u(tier).u(slot).u(1).u(0);
  return r.arr(0).arr(0).get();
}

TEST(ConnectorMetadata, OtherVersionsAreRefusedNamingBoth) {
  for (uint64_t v : {uint64_t(0), uint64_t(kFormatVersion + 1), uint64_t(UINT64_MAX)}) {
    const std::string want = "version " + std::to_string(v);
    Raw same;   // version 2's layout
    same.meta_head(v).arr(0).arr(0).arr(0).arr(0);
    expect_corrupt<Meta>(same.get(), {want.c_str(), "reads version 2"});
    Raw more;   // a later version with another field
    more.meta_head(v, 10).arr(0).arr(0).arr(0).arr(0).u(0);
    expect_corrupt<Meta>(more.get(), {want.c_str(), "reads version 2"});
  }
  std::string b = encode(full_report());
  ASSERT_EQ(b[15], 0x02);  // after the array and the 13-byte magic
  b[15] = 0x01;            // version 1: no world size, no rank
  expect_corrupt<Report>(b, {"version 1", "reads version 2"});
}

TEST(ConnectorMetadata, WrongMagicIsRefused) {
  const std::string meta = encode(Meta{}), report = encode(Report{});
  expect_corrupt<Meta>(report, {"begins with \"kvtier-report\", not \"kvtier-meta\""});
  expect_corrupt<Report>(meta, {"begins with \"kvtier-meta\", not \"kvtier-report\""});
  std::string b = meta;
  b[2] = 'K';
  expect_corrupt<Meta>(b, {"does not begin with"});
  expect_corrupt<Meta>(bytes({0x90}), {"not an array beginning with"});
  expect_corrupt<Meta>(bytes({0x01}), {"not an array beginning with"});
  expect_corrupt<Meta>(bytes({0xc1}), {"not msgpack", "offset 0"});
}

TEST(ConnectorMetadata, TierMustBeG2OrG3) {
  Meta m;
  const std::string good = meta_with("r", KVT_TIER_G2, 0);
  ASSERT_EQ(decode(&m, good.data(), good.size()), KVT_OK) << last_error();
  for (uint64_t tier : {uint64_t(0), uint64_t(KVT_TIER_G1), uint64_t(4), uint64_t(258)})
    expect_corrupt<Meta>(meta_with("r", tier, 0), {"loads[0].ops[0].tier"});
}

TEST(ConnectorMetadata, SlotMustBeWithinTheMessagesShape) {
  Meta m;  // the shape of meta_with: 8 G2 and 8 G3 blocks
  for (uint64_t tier : {KVT_TIER_G2, KVT_TIER_G3}) {
    const std::string last = meta_with("r", tier, 7);
    EXPECT_EQ(decode(&m, last.data(), last.size()), KVT_OK) << last_error();
    expect_corrupt<Meta>(meta_with("r", tier, 8), {"loads[0].ops[0].slot", "is 8", "of 8"});
    expect_corrupt<Meta>(meta_with("r", tier, 1ull << 32), {"loads[0].ops[0].slot"});
  }
  // A tier of capacity 0 has no slot at all.
  Raw r;
  r.arr(9).str("kvtier-meta").u(kFormatVersion).shape(8, 0).u(1);
  r.pk.pack_false();
  r.arr(0).arr(0).arr(1).arr(3).u(5).str("r").arr(1).arr(5).u(0).u(KVT_TIER_G3).u(0).u(1).u(0);
  expect_corrupt<Meta>(r.arr(0).get(), {"stores[0].ops[0].slot", "G3 capacity of 0"});
}

TEST(ConnectorMetadata, RequestIdsAreOneTo255BytesWithoutNul) {
  Meta m;
  const std::string longest(KVT_REQ_ID_MAX, 'q');
  const std::string good = meta_with(longest, 2, 0);
  ASSERT_EQ(decode(&m, good.data(), good.size()), KVT_OK) << last_error();
  EXPECT_EQ(m.loads.at(0).req_id, longest);
  expect_corrupt<Meta>(meta_with("", 2, 0), {"loads[0].req_id", "0 bytes"});
  expect_corrupt<Meta>(meta_with(std::string(256, 'q'), 2, 0), {"loads[0].req_id", "256 bytes"});
  expect_corrupt<Meta>(meta_with(std::string("a\0b", 3), 2, 0), {"NUL"});
  // The lists of finished ids, in both messages.
  Raw fin;
  fin.meta_head().arr(0).arr(0).arr(0).arr(2).str("ok").str("");
  expect_corrupt<Meta>(fin.get(), {"finished[1]", "0 bytes"});
  Raw rep;
  rep.report_head().arr(0).arr(0).arr(0).arr(1).str(std::string(256, 'z')).u(0);
  expect_corrupt<Report>(rep.get(), {"finished_recving[0]", "256 bytes"});
}

TEST(ConnectorMetadata, WrongTypesAreRefusedByField) {
  Raw step;  // step as a string
  step.arr(9).str("kvtier-meta").u(kFormatVersion).shape().str("1");
  step.pk.pack_false();
  expect_corrupt<Meta>(step.arr(0).arr(0).arr(0).arr(0).get(), {"step is a string"});
  Raw async;  // async_load as an integer
  async.arr(9).str("kvtier-meta").u(kFormatVersion).shape().u(1).u(0);
  expect_corrupt<Meta>(async.arr(0).arr(0).arr(0).arr(0).get(), {"async_load"});
  Raw g1;  // a g1 block id above 2^32 - 1
  g1.meta_head().arr(0).arr(1).arr(3).u(5).str("r").arr(1).arr(5).u(1ull << 32).u(2).u(0).u(0);
  expect_corrupt<Meta>(g1.u(0).arr(0).arr(0).get(), {"loads[0].ops[0].g1", "4294967296"});
  Raw shape;  // page_size negative
  shape.arr(8).str("kvtier-report").u(kFormatVersion).arr(4).i(-16).u(1).u(1).u(1);
  expect_corrupt<Report>(shape.arr(0).arr(0).arr(0).arr(0).u(0).get(), {"shape.page_size"});
  Raw fields;  // a batch of 4 fields
  fields.meta_head().arr(0).arr(1).arr(4).u(5).str("r").arr(0).u(0);
  expect_corrupt<Meta>(fields.arr(0).arr(0).get(), {"loads[0] has 4 fields, not 3"});
  Raw map;  // a map where the message is
  map.pk.pack_map(0);
  expect_corrupt<Meta>(map.get(), {"not an array beginning with"});
}

TEST(ConnectorMetadata, FailuresHoldAnErrorStatusAnd32BitOp) {
  auto report = [](uint64_t op, int64_t status) {
    Raw r;
    r.report_head().arr(0).arr(1).arr(2).u(9).arr(1).arr(2).u(op).i(status);
    return r.arr(0).arr(0).u(0).get();
  };
  Report out;
  const std::string good = report(UINT32_MAX, KVT_ERR_CORRUPT);
  ASSERT_EQ(decode(&out, good.data(), good.size()), KVT_OK) << last_error();
  EXPECT_EQ(out.stores.at(0).failed.at(0), (Failure{UINT32_MAX, KVT_ERR_CORRUPT}));
  expect_corrupt<Report>(report(1ull << 32, KVT_ERR_IO), {"stores[0].failed[0].op"});
  expect_corrupt<Report>(report(0, KVT_OK), {"stores[0].failed[0].status"});
  expect_corrupt<Report>(report(0, 5), {"stores[0].failed[0].status"});
  expect_corrupt<Report>(report(0, int64_t(INT32_MIN) - 1), {"stores[0].failed[0].status"});
}

// Version 2: the world's size is 1..KVT_MAX_WORLD_SIZE, and a report's rank below it.
TEST(ConnectorMetadata, WorldSizeAndRankAreInRange) {
  auto report = [](uint64_t world, uint64_t rank) {
    Raw r;
    r.report_head(world).arr(0).arr(0).arr(0).arr(0).u(rank);
    return r.get();
  };
  Report out;
  const std::string good = report(KVT_MAX_WORLD_SIZE, KVT_MAX_WORLD_SIZE - 1);
  ASSERT_EQ(decode(&out, good.data(), good.size()), KVT_OK) << last_error();
  EXPECT_EQ(out.shape.world_size, uint32_t(KVT_MAX_WORLD_SIZE));
  EXPECT_EQ(out.rank, uint32_t(KVT_MAX_WORLD_SIZE - 1));
  expect_corrupt<Report>(report(2, 2), {"rank is 2, but the world has 2"});
  expect_corrupt<Report>(report(0, 0), {"shape.world_size", "is 0"});
  expect_corrupt<Report>(report(KVT_MAX_WORLD_SIZE + 1, 0), {"shape.world_size", "4097"});
  expect_corrupt<Report>(report(1, 1ull << 32), {"rank"});
  Raw meta;
  meta.arr(9).str("kvtier-meta").u(kFormatVersion).shape(8, 8, 0).u(1);
  meta.pk.pack_false();
  expect_corrupt<Meta>(meta.arr(0).arr(0).arr(0).arr(0).get(), {"shape.world_size"});
}

// Array headers that claim far more elements than the bytes hold are refused as truncated
// before anything is allocated for them (msgpack would allocate 16 bytes per claimed
// element; under ASan a 64 GiB allocation aborts).
TEST(ConnectorMetadata, HugeCountsAreRefusedBeforeAllocating) {
  expect_corrupt<Meta>(bytes({0xdd, 0xff, 0xff, 0xff, 0xff}), {"truncated"});
  Raw r;
  r.meta_head().arr(0).arr(UINT32_MAX);
  expect_corrupt<Meta>(r.get(), {"truncated"});
  Raw s;  // a string header claiming 4 GiB
  s.report_head().arr(0).arr(0).arr(1);
  std::string b = s.get() + bytes({0xdb, 0xff, 0xff, 0xff, 0xff});
  expect_corrupt<Report>(b, {"truncated"});
}

TEST(ConnectorMetadata, DeepNestingIsRefused) {
  std::string b(100000, char(0x91));
  b += char(0x00);
  expect_corrupt<Meta>(b, {"nested deeper"});
}

}  // namespace
}  // namespace kvt::conn
