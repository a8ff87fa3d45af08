// The observe stream (kvtier.h, "Observe"; docs/EVENTS.md): seed 003's two requests through
// the connector, seen by a subscriber, the recorder's ring and an event log; a subscriber
// that falls behind; logs torn or damaged at every byte; bad arguments.
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <algorithm>
#include <fstream>
#include <future>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "connector_support.hpp"
#include "endpoint_client.hpp"

using namespace kvt_conn_test;

namespace {

// Seed 003 with A then B (B loads A's two blocks from G2 and computes its third).
void run_seed(Rig &r) {
  r.run_a();
  auto b = seed_b();
  auto hb = hashes_of(b);
  EXPECT_EQ(r.match("B", b).first, 32u);
  ASSERT_KVT_OK(r.alloc("B", {4, 5, 6, 7}, 32));
  r.step(r.meta({{"B", 32, 20}}), {{6, hb[2]}}, r.counts(3, 2));
  r.step(r.meta({{"B", 52, 1, {}, {3000}}}), {}, r.counts(3, 2));
  EXPECT_EQ(r.finish("B"), 0);
}

std::vector<kvt_obs_event> drain_all(kvt_subscription *s) {
  std::vector<kvt_obs_event> all;
  kvt_obs_event buf[64];
  while (size_t n = kvt_subscription_drain(s, buf, 64)) all.insert(all.end(), buf, buf + n);
  return all;
}

// Every record of the log at path; *end is the status that stopped the reading.
std::vector<kvt_obs_event> read_log(const std::string &path, kvt_status *end,
                                    std::string *why = nullptr) {
  std::vector<kvt_obs_event> out;
  kvt_event_log *l = nullptr;
  *end = kvt_event_log_open(&l, path.c_str());
  if (*end != KVT_OK) return out;
  kvt_obs_event e;
  while ((*end = kvt_event_log_read(&e, l)) == KVT_OK) out.push_back(e);
  if (why) *why = kvt_last_error();
  kvt_event_log_close(l);
  return out;
}

bool same(const kvt_obs_event &a, const kvt_obs_event &b) {
  return std::memcmp(&a, &b, sizeof a) == 0;
}

// A call that might block forever (as the recorder's did on a FIFO before issue 24), on a
// thread of its own: returned() waits up to 30 s for it, so that such a call fails the test
// instead of hanging it, once the test has let it go.
class Background {
 public:
  template <class F>
  explicit Background(F f) : thread_([this, f] { f(); done_.set_value(); }) {}
  ~Background() { thread_.join(); }
  bool returned() {
    return ready_.wait_for(std::chrono::seconds(30)) == std::future_status::ready;
  }

 private:
  std::promise<void> done_;
  std::future<void> ready_ = done_.get_future();
  std::thread thread_;
};

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// One registration and its release: events on m's bus.
void emit_one(kvt_manager *m, uint64_t hash) {
  kvt_block b = 0, r = 0;
  if (kvt_block_alloc(&b, 1, m, KVT_TIER_G1) != KVT_OK) return;
  if (kvt_block_register_hash(&r, m, b, hash, 0) == KVT_OK) kvt_block_release(m, &r, 1);
}

}  // namespace

TEST(Observe, SeedScenarioStreamsSlotsCandidatesBlocksAndTransfers) {
  TempDir dir;
  Rig r;
  kvt_subscription *sub = nullptr;
  ASSERT_KVT_OK(kvt_subscription_create(&sub, r.m.get(), 100000));
  ASSERT_KVT_OK(kvt_manager_recorder_ring(r.m.get(), 16));
  const std::string log = dir.path + "/run.kvtlog", ring = dir.path + "/ring.kvtlog";
  ASSERT_KVT_OK(kvt_manager_recorder_open(r.m.get(), log.c_str()));
  run_seed(r);
  ASSERT_KVT_OK(kvt_manager_recorder_close(r.m.get()));
  ASSERT_KVT_OK(kvt_manager_recorder_dump(r.m.get(), ring.c_str()));

  std::vector<kvt_obs_event> ev = drain_all(sub);
  ASSERT_GT(ev.size(), 20u);
  for (size_t i = 0; i < ev.size(); ++i) {
    ASSERT_EQ(ev[i].seq, i + 1) << "a gap in the sequence numbers";
    if (i > 0) {
      EXPECT_GE(ev[i].time_ns, ev[i - 1].time_ns);
    }
  }

  // Slots: each request's SLOT events retrace its history, with the call that moved it.
  std::map<std::string, std::vector<std::string>> states;
  std::map<std::string, std::vector<uint32_t>> triggers;
  for (const auto &e : ev) {
    if (e.kind != KVT_OBS_SLOT) continue;
    auto &h = states[e.req_id];
    if (h.empty()) EXPECT_EQ(e.prev, 0u) << "a slot's first event is its creation";
    else EXPECT_EQ(kvt_slot_state_str(e.prev), h.back()) << e.req_id;
    if (h.empty() || h.back() != kvt_slot_state_str(e.state))
      h.push_back(kvt_slot_state_str(e.state));
    triggers[e.req_id].push_back(e.trigger);
  }
  EXPECT_EQ(states["A"], history(r.c, "A"));
  EXPECT_EQ(states["B"], history(r.c, "B"));
  EXPECT_EQ(triggers["B"], (std::vector<uint32_t>{
                               KVT_TRIGGER_GET_NUM_NEW_MATCHED_TOKENS,
                               KVT_TRIGGER_GET_NUM_NEW_MATCHED_TOKENS,
                               KVT_TRIGGER_UPDATE_STATE_AFTER_ALLOC,
                               KVT_TRIGGER_BUILD_CONNECTOR_META, KVT_TRIGGER_BUILD_CONNECTOR_META,
                               KVT_TRIGGER_REQUEST_FINISHED, KVT_TRIGGER_REQUEST_FINISHED}));

  // Candidates: B's load is evaluated, promoted and completed; every promoted batch ends
  // exactly once, completed.
  std::map<uint64_t, std::vector<uint32_t>> batch;
  std::vector<uint32_t> b_load;
  for (const auto &e : ev) {
    if (e.kind != KVT_OBS_CANDIDATE) continue;
    if (e.batch) batch[e.batch].push_back(e.state);
    if (std::string(e.req_id) == "B" && e.dst == KVT_TIER_G1) {
      b_load.push_back(e.state);
      EXPECT_EQ(e.src, uint32_t(KVT_TIER_G2));
      EXPECT_EQ(e.blocks, 2u);
    }
  }
  EXPECT_EQ(b_load, (std::vector<uint32_t>{KVT_CANDIDATE_PENDING_EVALUATION,
                                           KVT_CANDIDATE_PROMOTED, KVT_CANDIDATE_COMPLETED}));
  EXPECT_EQ(batch.size(), 3u) << "A's store, B's load, B's store";
  for (auto &[id, s] : batch)
    EXPECT_EQ(s, (std::vector<uint32_t>{KVT_CANDIDATE_PROMOTED, KVT_CANDIDATE_COMPLETED}))
        << "batch " << id;

  // Blocks: G2 registered exactly B's three hashes (A's two are B's first two).
  std::set<uint64_t> stored;
  for (const auto &e : ev)
    if (e.kind == KVT_OBS_BLOCK_STORED && e.dst == KVT_TIER_G2) stored.insert(e.hash);
  auto hb = hashes_of(seed_b());
  EXPECT_EQ(stored, std::set<uint64_t>(hb.begin(), hb.end()));

  // Transfers: the worker's copies, with their bytes.
  uint64_t out = 0, in = 0;
  for (const auto &e : ev) {
    if (e.kind != KVT_OBS_TRANSFER) continue;
    EXPECT_EQ(e.status, KVT_OK);
    EXPECT_EQ(e.bytes, e.blocks * kBlock);
    EXPECT_GT(e.duration_ns, 0u);
    EXPECT_NE(e.batch, 0u);
    (e.dst == KVT_TIER_G1 ? in : out) += e.blocks;
  }
  EXPECT_EQ(out, 3u);
  EXPECT_EQ(in, 2u);

  // The log holds the same events, byte for byte; the ring its last 16.
  kvt_status end;
  std::vector<kvt_obs_event> logged = read_log(log, &end);
  EXPECT_EQ(end, KVT_ITEROVER) << kvt_last_error();
  ASSERT_EQ(logged.size(), ev.size());
  for (size_t i = 0; i < ev.size(); ++i) EXPECT_TRUE(same(logged[i], ev[i])) << "event " << i;
  std::vector<kvt_obs_event> ringed = read_log(ring, &end);
  EXPECT_EQ(end, KVT_ITEROVER) << kvt_last_error();
  ASSERT_EQ(ringed.size(), 16u);
  for (size_t i = 0; i < 16; ++i) EXPECT_TRUE(same(ringed[i], ev[ev.size() - 16 + i]));
  kvt_subscription_destroy(sub);
}

TEST(Observe, ASlowSubscriberLosesTheOldestAndIsToldHowMany) {
  Rig r;
  kvt_subscription *slow = nullptr, *full = nullptr;
  ASSERT_KVT_OK(kvt_subscription_create(&slow, r.m.get(), 4));
  ASSERT_KVT_OK(kvt_subscription_create(&full, r.m.get(), 100000));
  pollfd p{kvt_subscription_fd(slow), POLLIN, 0};
  EXPECT_EQ(poll(&p, 1, 0), 0) << "readable with nothing queued";
  run_seed(r);
  EXPECT_EQ(poll(&p, 1, 0), 1);
  std::vector<kvt_obs_event> all = drain_all(full), got = drain_all(slow);
  ASSERT_GT(all.size(), 5u);
  ASSERT_EQ(got.size(), 5u);
  EXPECT_EQ(got[0].kind, uint32_t(KVT_OBS_DROPPED));
  EXPECT_EQ(got[0].seq, 0u);
  EXPECT_EQ(got[0].count, all.size() - 4);
  for (size_t i = 0; i < 4; ++i) EXPECT_TRUE(same(got[1 + i], all[all.size() - 4 + i]));
  EXPECT_EQ(poll(&p, 1, 0), 0) << "still readable once drained";
  kvt_subscription_destroy(slow);
  kvt_subscription_destroy(full);
}

TEST(Observe, ALogTornAtAnyByteIsReadToItsLastWholeRecord) {
  TempDir dir;
  const std::string log = dir.path + "/run.kvtlog", cut = dir.path + "/cut.kvtlog";
  {
    Rig r;
    ASSERT_KVT_OK(kvt_manager_recorder_open(r.m.get(), log.c_str()));
    r.run_a();
  }  // the manager's destroy closes the log
  kvt_status end;
  std::vector<kvt_obs_event> whole = read_log(log, &end);
  ASSERT_EQ(end, KVT_ITEROVER);
  ASSERT_GT(whole.size(), 5u);
  const std::string bytes = slurp(log);
  // Record boundaries, from the records' own lengths.
  std::set<size_t> bounds{16};
  for (size_t at = 16; at < bytes.size();) {
    at += 8 + (uint8_t(bytes[at]) | uint8_t(bytes[at + 1]) << 8);
    bounds.insert(at);
  }
  ASSERT_EQ(bounds.size(), whole.size() + 1);
  for (size_t len = 0; len <= bytes.size(); ++len) {
    spit(cut, bytes.substr(0, len));
    std::string why;
    std::vector<kvt_obs_event> got = read_log(cut, &end, &why);
    if (len < 16) {
      EXPECT_EQ(end, KVT_ERR_CORRUPT) << len;
      continue;
    }
    size_t whole_records = size_t(std::distance(bounds.begin(), bounds.upper_bound(len))) - 1;
    ASSERT_EQ(got.size(), whole_records) << "cut at " << len;
    for (size_t i = 0; i < got.size(); ++i) ASSERT_TRUE(same(got[i], whole[i]));
    if (bounds.count(len)) {
      EXPECT_EQ(end, KVT_ITEROVER) << len;
    } else {
      EXPECT_EQ(end, KVT_ERR_CORRUPT) << len;
      EXPECT_NE(why.find("at byte " + std::to_string(*std::prev(bounds.upper_bound(len)))),
                std::string::npos)
          << why;
    }
  }
  // A flipped byte inside record 3 ends the reading there, wherever it is.
  const size_t r3 = *std::next(bounds.begin(), 3), r4 = *std::next(bounds.begin(), 4);
  for (size_t at = r3; at < r4; ++at) {
    std::string bad = bytes;
    bad[at] = char(bad[at] ^ 0x20);
    spit(cut, bad);
    std::vector<kvt_obs_event> got = read_log(cut, &end);
    EXPECT_EQ(end, KVT_ERR_CORRUPT) << "flip at " << at;
    EXPECT_EQ(got.size(), 3u) << "flip at " << at;
  }
  // A later format version is refused, not misread; format 1 (schema 1) logs still read.
  std::string v3 = bytes;
  v3[8] = 3;
  spit(cut, v3);
  read_log(cut, &end);
  EXPECT_EQ(end, KVT_ERR_UNSUPPORTED);
  EXPECT_NE(std::string(kvt_last_error()).find("format 3"), std::string::npos) << kvt_last_error();
  std::string v1 = bytes;
  v1[8] = 1;
  v1[12] = 1;
  spit(cut, v1);
  EXPECT_EQ(read_log(cut, &end).size(), bounds.size() - 1);
  EXPECT_EQ(end, KVT_ITEROVER) << kvt_last_error();
}

TEST(Observe, BadArgumentsGetAStatusAndAMessage) {
  TempDir dir;
  Rig r;
  kvt_subscription *s = nullptr;
  EXPECT_KVT(kvt_subscription_create(&s, r.m.get(), 0), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_KVT(kvt_subscription_create(&s, r.m.get(), (size_t{1} << 24) + 1),
             KVT_ERR_INVALID_ARGUMENT);
  EXPECT_KVT(kvt_subscription_create(&s, nullptr, 8), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_KVT(kvt_subscription_create(&s, reinterpret_cast<kvt_manager *>(&r.g1), 8),
             KVT_ERR_INVALID_HANDLE);
  EXPECT_KVT(kvt_subscription_create(nullptr, r.m.get(), 8), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(s, nullptr);
  EXPECT_EQ(kvt_subscription_fd(nullptr), -1);
  EXPECT_EQ(kvt_subscription_drain(nullptr, nullptr, 0), 0u);
  kvt_subscription_destroy(nullptr);

  EXPECT_KVT(kvt_manager_recorder_dump(r.m.get(), (dir.path + "/x").c_str()), KVT_ERR_STATE);
  EXPECT_KVT(kvt_manager_recorder_ring(r.m.get(), (size_t{1} << 24) + 1), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_KVT(kvt_manager_recorder_open(r.m.get(), "/nonexistent-dir/x.kvtlog"), KVT_ERR_IO);
  EXPECT_KVT(kvt_manager_recorder_open(r.m.get(), nullptr), KVT_ERR_INVALID_ARGUMENT);
  const std::string log = dir.path + "/a.kvtlog";
  ASSERT_KVT_OK(kvt_manager_recorder_open(r.m.get(), log.c_str()));
  EXPECT_KVT(kvt_manager_recorder_open(r.m.get(), log.c_str()), KVT_ERR_STATE);
  ASSERT_KVT_OK(kvt_manager_recorder_close(r.m.get()));
  ASSERT_KVT_OK(kvt_manager_recorder_close(r.m.get()));  // closing a closed log is a no-op

  kvt_event_log *l = nullptr;
  EXPECT_KVT(kvt_event_log_open(&l, (dir.path + "/missing").c_str()), KVT_ERR_IO);
  spit(dir.path + "/junk", "this is not an event log at all");
  EXPECT_KVT(kvt_event_log_open(&l, (dir.path + "/junk").c_str()), KVT_ERR_CORRUPT);
  EXPECT_EQ(l, nullptr);
  kvt_obs_event e;
  EXPECT_KVT(kvt_event_log_read(&e, nullptr), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_KVT(kvt_event_log_read(&e, reinterpret_cast<kvt_event_log *>(&r.g1)),
             KVT_ERR_INVALID_HANDLE);
  EXPECT_KVT(kvt_event_log_read(nullptr, reinterpret_cast<kvt_event_log *>(s)),
             KVT_ERR_INVALID_ARGUMENT);
  kvt_event_log_close(nullptr);
  EXPECT_STREQ(kvt_obs_kind_str(99), "UNKNOWN");
  EXPECT_STREQ(kvt_candidate_state_str(KVT_CANDIDATE_PROMOTED), "PROMOTED");
  EXPECT_STREQ(kvt_obs_trigger_str(KVT_TRIGGER_REQUEST_PREEMPTED), "REQUEST_PREEMPTED");
}

TEST(Observe, ASubscriptionMayOutliveItsManager) {
  kvt_subscription *s = nullptr;
  size_t got = 0;
  {
    Rig r;
    ASSERT_KVT_OK(kvt_subscription_create(&s, r.m.get(), 1000));
    r.run_a();
  }
  got = drain_all(s).size();
  EXPECT_GT(got, 5u) << "the events queued before the manager went are still there";
  EXPECT_EQ(drain_all(s).size(), 0u);
  kvt_subscription_destroy(s);
}

// kvt_manager_recorder_open and kvt_manager_recorder_dump refuse a FIFO at once, with or without a
// reader at its other end, and engine calls go on meanwhile. Before issue 24 the open waited in
// open(2) for a reader while holding the bus lock that every event takes: the open and the
// engine both hung (here: until the test opened the FIFO's other end).
TEST(Observe, RecorderRefusesAFifoAtOnceAndTheEngineGoesOn) {
  TempDir dir;
  Fd other_end;  // outlives the manager: a log that the old code opened on the FIFO
  auto m = make(kvt_test::small_config(64, 0));
  kvt_subscription *sub = nullptr;
  ASSERT_KVT_OK(
      kvt_subscription_create(&sub, m.get(), 1024));  // the bus is on: events take its lock
  ASSERT_KVT_OK(kvt_manager_recorder_ring(m.get(), 16));
  const std::string fifo = dir.path + "/fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  kvt_status st = KVT_OK;
  std::string why;
  {
    std::atomic<bool> opened{false};
    Background open([&] {
      st = kvt_manager_recorder_open(m.get(), fifo.c_str());
      why = kvt_last_error();
      opened = true;
    });
    Background engine([&] {
      for (uint64_t h = 1; h <= 3 || !opened; ++h) emit_one(m.get(), h);
    });
    const bool open_returned = open.returned(), engine_went_on = engine.returned();
    if (!open_returned) other_end.fd = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK);
    EXPECT_TRUE(open_returned) << "kvt_manager_recorder_open blocked on a FIFO without a reader";
    EXPECT_TRUE(engine_went_on)
        << "engine calls blocked while kvt_manager_recorder_open was under way";
  }
  EXPECT_EQ(st, KVT_ERR_INVALID_ARGUMENT) << why;
  EXPECT_NE(why.find("'" + fifo + "' is a FIFO"), std::string::npos) << why;
  {
    Background dump([&] {
      st = kvt_manager_recorder_dump(m.get(), fifo.c_str());
      why = kvt_last_error();
    });
    const bool returned = dump.returned();
    if (!returned && other_end.fd < 0)
      other_end.fd = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK);
    EXPECT_TRUE(returned) << "kvt_manager_recorder_dump blocked on a FIFO without a reader";
  }
  EXPECT_EQ(st, KVT_ERR_INVALID_ARGUMENT) << why;
  // With a reader there, neither would block; both are refused all the same, and nothing
  // reaches the FIFO.
  if (other_end.fd < 0) other_end.fd = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK);
  ASSERT_GE(other_end.fd, 0) << std::strerror(errno);
  EXPECT_KVT(kvt_manager_recorder_open(m.get(), fifo.c_str()), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_KVT(kvt_manager_recorder_dump(m.get(), fifo.c_str()), KVT_ERR_INVALID_ARGUMENT);
  char byte;
  EXPECT_EQ(read(other_end.fd, &byte, 1), 0) << "the FIFO has a writer, or bytes";
  ASSERT_KVT_OK(kvt_manager_recorder_close(m.get()));
  kvt_subscription_destroy(sub);
}

// The recorder refuses a symbolic link at the log's path, dangling or not, and leaves what it
// leads to as it was (before issue 24 it followed the link and truncated the target); and a
// device and a directory. A link among the directories above the file is followed: O_NOFOLLOW
// guards the last component only, the convention of G3's files too.
TEST(Observe, RecorderRefusesSymlinksDevicesAndDirectories) {
  TempDir dir;
  auto m = make(kvt_test::small_config(8, 0));
  ASSERT_KVT_OK(kvt_manager_recorder_ring(m.get(), 16));
  emit_one(m.get(), 1);
  const std::string target = dir.path + "/precious", link = dir.path + "/link",
                    dangling = dir.path + "/dangling", nothing = dir.path + "/nothing";
  const std::string bytes = "the engine's own file, not an event log\n";
  spit(target, bytes);
  ASSERT_EQ(symlink(target.c_str(), link.c_str()), 0);
  ASSERT_EQ(symlink(nothing.c_str(), dangling.c_str()), 0);
  for (const std::string &path : {link, dangling}) {
    EXPECT_KVT(kvt_manager_recorder_open(m.get(), path.c_str()), KVT_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(kvt_last_error()).find("'" + path + "' is a symbolic link"),
              std::string::npos)
        << kvt_last_error();
    EXPECT_KVT(kvt_manager_recorder_dump(m.get(), path.c_str()), KVT_ERR_INVALID_ARGUMENT);
  }
  EXPECT_EQ(slurp(target), bytes);
  EXPECT_FALSE(std::filesystem::exists(nothing));
  const std::pair<std::string, const char *> others[] = {{"/dev/null", "a character device"},
                                                         {dir.path, "a directory"}};
  for (const auto &[path, what] : others) {
    EXPECT_KVT(kvt_manager_recorder_open(m.get(), path.c_str()), KVT_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(kvt_last_error()).find(what), std::string::npos) << kvt_last_error();
    EXPECT_KVT(kvt_manager_recorder_dump(m.get(), path.c_str()), KVT_ERR_INVALID_ARGUMENT);
  }
  const std::string via = dir.path + "/via";
  ASSERT_EQ(symlink(dir.path.c_str(), via.c_str()), 0);
  ASSERT_KVT_OK(kvt_manager_recorder_open(m.get(), (via + "/run.kvtlog").c_str()));
  emit_one(m.get(), 2);
  ASSERT_KVT_OK(kvt_manager_recorder_close(m.get()));
  ASSERT_KVT_OK(kvt_manager_recorder_dump(m.get(), (via + "/ring.kvtlog").c_str()));
  for (const char *name : {"/run.kvtlog", "/ring.kvtlog"}) {
    kvt_status end;
    EXPECT_FALSE(read_log(dir.path + name, &end).empty()) << name;
    EXPECT_EQ(end, KVT_ITEROVER) << name;
  }
}

// kvt_event_log_open reads regular files only: a FIFO without a writer is refused at once
// (before issue 24 it waited in fopen for a writer forever), and so are a device and a
// directory. A link to a log is followed: reading through one harms nothing.
TEST(Observe, EventLogOpenRefusesAFifoADeviceAndADirectory) {
  TempDir dir;
  const std::string fifo = dir.path + "/fifo", log = dir.path + "/run.kvtlog",
                    link = dir.path + "/link";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  kvt_status st = KVT_OK;
  std::string why;
  kvt_event_log *l = nullptr;
  {
    Background open([&] {
      st = kvt_event_log_open(&l, fifo.c_str());
      why = kvt_last_error();
    });
    const bool returned = open.returned();
    if (!returned) ::close(::open(fifo.c_str(), O_WRONLY | O_NONBLOCK));  // lets it go: EOF
    EXPECT_TRUE(returned) << "kvt_event_log_open blocked on a FIFO without a writer";
  }
  EXPECT_EQ(st, KVT_ERR_INVALID_ARGUMENT) << why;
  EXPECT_NE(why.find("'" + fifo + "' is a FIFO"), std::string::npos) << why;
  kvt_event_log_close(l);
  l = nullptr;
  for (const std::string &path : {std::string("/dev/null"), dir.path}) {
    EXPECT_KVT(kvt_event_log_open(&l, path.c_str()), KVT_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(l, nullptr);
    kvt_log_replay out{};
    out.struct_size = sizeof out;
    EXPECT_KVT(kvt_event_log_replay(&out, nullptr, path.c_str()), KVT_ERR_INVALID_ARGUMENT);
  }
  {
    auto m = make(kvt_test::small_config(8, 0));
    ASSERT_KVT_OK(kvt_manager_recorder_open(m.get(), log.c_str()));
    emit_one(m.get(), 1);
  }
  ASSERT_EQ(symlink(log.c_str(), link.c_str()), 0);
  kvt_status end;
  EXPECT_FALSE(read_log(link, &end).empty());
  EXPECT_EQ(end, KVT_ITEROVER) << kvt_last_error();
}

// Of four threads that open a log at once exactly one succeeds, the others get
// KVT_ERR_STATE; a close racing an open leaves no error and a log that reads back whole.
// Engine calls go on throughout (under TSan too).
TEST(Observe, RacingRecorderOpensLetExactlyOneWin) {
  TempDir dir;
  auto m = make(kvt_test::small_config(64, 0));
  kvt_subscription *sub = nullptr;
  ASSERT_KVT_OK(kvt_subscription_create(&sub, m.get(), 64));
  std::atomic<bool> stop{false};
  std::thread engine([&] {
    for (uint64_t h = 1; !stop; ++h) emit_one(m.get(), h);
  });
  auto name = [&](int round, int i) {
    return dir.path + "/" + std::to_string(round) + "-" + std::to_string(i);
  };
  for (int round = 0; round < 10; ++round) {
    std::atomic<int> won{0}, busy{0};
    std::vector<std::thread> openers;
    for (int i = 0; i < 4; ++i)
      openers.emplace_back([&, i] {
        kvt_status s = kvt_manager_recorder_open(m.get(), name(round, i).c_str());
        if (s == KVT_OK) ++won;
        else if (s == KVT_ERR_STATE) ++busy;
      });
    for (auto &t : openers) t.join();
    EXPECT_EQ(won.load(), 1) << "round " << round;
    EXPECT_EQ(busy.load(), 3) << "round " << round;
    EXPECT_KVT(kvt_manager_recorder_close(m.get()), KVT_OK);
  }
  const std::string raced = dir.path + "/raced";
  std::atomic<kvt_status> closed{KVT_OK};
  std::thread closer([&] { closed = kvt_manager_recorder_close(m.get()); });
  EXPECT_KVT(kvt_manager_recorder_open(m.get(), raced.c_str()), KVT_OK);
  closer.join();
  EXPECT_EQ(closed.load(), KVT_OK);
  EXPECT_KVT(kvt_manager_recorder_close(m.get()), KVT_OK);
  stop = true;
  engine.join();
  kvt_status end;
  std::vector<kvt_obs_event> got = read_log(raced, &end);
  EXPECT_EQ(end, KVT_ITEROVER);
  for (size_t k = 1; k < got.size(); ++k) ASSERT_EQ(got[k].seq, got[k - 1].seq + 1);
  for (int round = 0; round < 10; ++round) {
    int files = 0;  // a loser's is never created
    for (int i = 0; i < 4; ++i) {
      if (!std::filesystem::exists(name(round, i))) continue;
      ++files;
      read_log(name(round, i), &end);
      EXPECT_EQ(end, KVT_ITEROVER) << name(round, i);
    }
    EXPECT_EQ(files, 1) << "round " << round;
  }
  kvt_subscription_destroy(sub);
}

// Under TSan too: three threads allocate, register and release (BLOCK_* events from three
// threads at once) while a fourth subscribes and unsubscribes, resizes and dumps the ring,
// and opens and closes logs. A reader there from start to end sees every event once, in
// sequence, without a gap; every log written meanwhile reads back in sequence.
TEST(Threads, ObserveReadersComeAndGoWhileThreeThreadsWork) {
  TempDir dir;
  auto m = make(kvt_test::small_config(256, 256));
  kvt_subscription *all = nullptr;
  ASSERT_KVT_OK(kvt_subscription_create(&all, m.get(), size_t{1} << 22));
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> failures{0};
  auto worker = [&](uint64_t id) {
    for (uint64_t i = 0; i < 3000; ++i) {
      kvt_block b = 0, r = 0;
      if (kvt_block_alloc(&b, 1, m.get(), KVT_TIER_G1) != KVT_OK) continue;
      if (kvt_block_register_hash(&r, m.get(), b, id << 32 | i, 0) != KVT_OK) ++failures;
      if (kvt_block_release(m.get(), &r, 1) != KVT_OK) ++failures;
    }
  };
  int logs = 0;
  std::thread observer([&] {
    for (int round = 0; !stop.load(); ++round) {
      kvt_subscription *s = nullptr;
      if (kvt_subscription_create(&s, m.get(), 64) != KVT_OK) ++failures;
      kvt_obs_event buf[16];
      for (int k = 0; k < 4; ++k) kvt_subscription_drain(s, buf, 16);
      kvt_subscription_destroy(s);
      if (kvt_manager_recorder_ring(m.get(), round % 2 ? 128 : 0) != KVT_OK) ++failures;
      if (round % 2) {
        if (kvt_manager_recorder_dump(m.get(), (dir.path + "/ring").c_str()) != KVT_OK) ++failures;
      }
      if (round % 8 == 0 && logs < 8) {
        const std::string log = dir.path + "/log" + std::to_string(logs++);
        if (kvt_manager_recorder_open(m.get(), log.c_str()) != KVT_OK) ++failures;
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        if (kvt_manager_recorder_close(m.get()) != KVT_OK) ++failures;
      }
    }
  });
  std::vector<std::thread> workers;
  for (uint64_t id = 1; id <= 3; ++id) workers.emplace_back(worker, id);
  for (auto &t : workers) t.join();
  stop = true;
  observer.join();
  EXPECT_EQ(failures.load(), 0u) << kvt_last_error();

  std::vector<kvt_obs_event> ev = drain_all(all);
  ASSERT_GE(ev.size(), 3u * 3000u) << "a BLOCK_STORED per registration at least";
  for (size_t i = 0; i < ev.size(); ++i) ASSERT_EQ(ev[i].seq, i + 1);
  kvt_subscription_destroy(all);
  for (int i = 0; i < logs; ++i) {
    kvt_status end;
    std::vector<kvt_obs_event> got = read_log(dir.path + "/log" + std::to_string(i), &end);
    EXPECT_EQ(end, KVT_ITEROVER);
    for (size_t k = 1; k < got.size(); ++k) ASSERT_EQ(got[k].seq, got[k - 1].seq + 1);
  }
}

TEST(Observe, MetricsTextCountsWhatHappened) {
  Rig r;
  kvt_subscription *slow = nullptr;
  ASSERT_KVT_OK(kvt_subscription_create(&slow, r.m.get(), 2));
  run_seed(r);
  size_t len = 0;
  EXPECT_KVT(kvt_metrics_text(nullptr, 0, &len, r.m.get(), r.c), KVT_OK);  // a query
  ASSERT_GT(len, 1000u);
  std::string text(len + 1, '\0');
  size_t len2 = 0;
  // No room for the NUL.
  EXPECT_KVT(kvt_metrics_text(text.data(), len, &len2, r.m.get(), r.c), KVT_ERR_INVALID_ARGUMENT);
  ASSERT_KVT_OK(kvt_metrics_text(text.data(), text.size(), &len2, r.m.get(), r.c));
  EXPECT_EQ(len2, len);
  text.resize(len);
  auto has = [&](const std::string &line) {
    return text.find("\n" + line + "\n") != std::string::npos;
  };
  EXPECT_TRUE(has("kvtier_slots_finished_total 2")) << text;
  EXPECT_TRUE(has("kvtier_slots{state=\"decoding\"} 0"));
  EXPECT_TRUE(has("kvtier_slot_transitions_total{from=\"onboard_staged\",to=\"onboarding\"} 1"));
  EXPECT_TRUE(has("kvtier_transfer_blocks_total{src=\"G1\",dst=\"G2\"} 3"));
  EXPECT_TRUE(has("kvtier_transfer_blocks_total{src=\"G2\",dst=\"G1\"} 2"));
  EXPECT_TRUE(has("kvtier_transfer_bytes_total{src=\"G2\",dst=\"G1\"} " +
                  std::to_string(2 * kBlock)));
  EXPECT_TRUE(has("kvtier_transfers_total{src=\"G2\",dst=\"G1\",result=\"completed\"} 1"));
  EXPECT_TRUE(has("kvtier_transfer_duration_seconds_count{src=\"G2\",dst=\"G1\"} 1"));
  EXPECT_TRUE(has("kvtier_transfer_duration_seconds_bucket{src=\"G2\",dst=\"G1\",le=\"+Inf\"} 1"));
  EXPECT_TRUE(has("kvtier_tier_blocks{tier=\"G2\",state=\"inactive\"} 3"));
  EXPECT_TRUE(has("kvtier_connector_stored_blocks_total 3"));
  EXPECT_TRUE(has("kvtier_tier_hits_total{tier=\"G2\"} 2"));
  kvt_obs_event d[4];
  ASSERT_EQ(kvt_subscription_drain(slow, d, 4), 3u);
  const uint64_t lost = d[0].count;
  EXPECT_GT(lost, 10u);
  EXPECT_TRUE(has("kvtier_events_dropped_total{reader=\"subscription\"} " + std::to_string(lost)));
  EXPECT_TRUE(has("kvtier_events_emitted_total " + std::to_string(lost + 2)));
  kvt_subscription_destroy(slow);

  // Without the connector: no slot families. With another manager's: refused.
  EXPECT_KVT(kvt_metrics_text(nullptr, 0, &len, r.m.get(), nullptr), KVT_OK);
  std::string bare(len + 1, '\0');
  ASSERT_KVT_OK(kvt_metrics_text(bare.data(), bare.size(), &len, r.m.get(), nullptr));
  EXPECT_EQ(bare.find("kvtier_slots"), std::string::npos);
  Rig other;
  EXPECT_KVT(kvt_metrics_text(bare.data(), bare.size(), &len, other.m.get(), r.c),
             KVT_ERR_INVALID_ARGUMENT);
  EXPECT_KVT(kvt_metrics_text(bare.data(), bare.size(), nullptr, r.m.get(), r.c),
             KVT_ERR_INVALID_ARGUMENT);
}

// A breakpoint on "any slot entering ONBOARDING" pauses seed 003's engine thread inside
// update_state_after_alloc for B; meanwhile the slots, the batches and the metrics show B
// onboarding with its load planned, and the engine goes on once resumed.
TEST(Breakpoints, PauseARealRunAtOnboardingInspectItAndResume) {
  Rig r;
  uint64_t bp = 0;
  ASSERT_KVT_OK(kvt_connector_breakpoint_add(&bp, r.c, KVT_SLOT_ONBOARDING, nullptr));
  std::atomic<bool> done{false};
  std::thread engine([&] {
    run_seed(r);
    done = true;
  });
  kvt_pause_info p{};
  p.struct_size = sizeof p;
  ASSERT_KVT_OK(kvt_connector_pause_wait(&p, r.c, 20'000'000'000));
  EXPECT_EQ(p.breakpoint, bp);
  EXPECT_STREQ(p.req_id, "B");
  EXPECT_EQ(p.prev, uint32_t(KVT_SLOT_ONBOARD_STAGED));
  EXPECT_EQ(p.state, uint32_t(KVT_SLOT_ONBOARDING));
  EXPECT_EQ(p.trigger, uint32_t(KVT_TRIGGER_UPDATE_STATE_AFTER_ALLOC));
  EXPECT_EQ(p.pauses, 1u);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(done.load()) << "the engine went on while paused";

  kvt_slot_info slots[4];
  size_t n = 0;
  ASSERT_KVT_OK(kvt_connector_slots(slots, 4, &n, r.c));
  ASSERT_EQ(n, 1u) << "A finished before B came";
  EXPECT_STREQ(slots[0].req_id, "B");
  EXPECT_EQ(slots[0].state, uint32_t(KVT_SLOT_ONBOARDING));
  EXPECT_EQ(slots[0].batches, 1u);
  EXPECT_EQ(slots[0].blocks, 4u);
  EXPECT_GT(slots[0].age_ns, 0u);
  kvt_batch_info batches[4];
  ASSERT_KVT_OK(kvt_connector_batches(batches, 4, &n, r.c));
  ASSERT_EQ(n, 1u);
  EXPECT_STREQ(batches[0].req_id, "B");
  EXPECT_EQ(batches[0].src, uint32_t(KVT_TIER_G2));
  EXPECT_EQ(batches[0].dst, uint32_t(KVT_TIER_G1));
  EXPECT_EQ(batches[0].blocks, 2u);
  EXPECT_EQ(batches[0].step, 0u) << "planned, not yet in a metadata";
  std::string text(1 << 16, '\0');
  size_t len = 0;
  ASSERT_KVT_OK(kvt_metrics_text(text.data(), text.size(), &len, r.m.get(), r.c));
  EXPECT_NE(text.find("\nkvtier_slots{state=\"onboarding\"} 1\n"), std::string::npos);

  ASSERT_KVT_OK(kvt_connector_breakpoint_remove(r.c, bp));
  ASSERT_KVT_OK(kvt_connector_resume(r.c));
  engine.join();
  EXPECT_TRUE(done.load());
  EXPECT_EQ(history(r.c, "B"), names({KVT_SLOT_INITIALIZED, KVT_SLOT_ONBOARD_STAGED,
                                      KVT_SLOT_ONBOARDING, KVT_SLOT_PREFILLING,
                                      KVT_SLOT_DECODING, KVT_SLOT_FINISHING,
                                      KVT_SLOT_FINISHED}));
  ASSERT_KVT_OK(kvt_connector_slots(nullptr, 0, &n, r.c));
  EXPECT_EQ(n, 0u);
}

// A breakpoint on a request pauses every call naming it; a pause nobody resumes ends at the
// timeout; kvt_connector_pause stops the next call.
TEST(Breakpoints, RequestBreakpointsTimeoutsAndPauseNext) {
  Rig r;
  ASSERT_KVT_OK(kvt_connector_set_pause_timeout(r.c, 30));
  uint64_t bp = 0;
  ASSERT_KVT_OK(kvt_connector_breakpoint_add(&bp, r.c, 0, "A"));
  const auto t0 = std::chrono::steady_clock::now();
  r.run_a();  // paused (and released by the timeout) at each of A's calls
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_GE(took, std::chrono::milliseconds(4 * 30)) << "match, alloc, meta, finished";
  EXPECT_EQ(history(r.c, "A"), names({KVT_SLOT_INITIALIZED, KVT_SLOT_PREFILLING,
                                      KVT_SLOT_FINISHING, KVT_SLOT_FINISHED}));
  ASSERT_KVT_OK(kvt_connector_breakpoint_remove(r.c, bp));

  ASSERT_KVT_OK(kvt_connector_set_pause_timeout(r.c, 20000));
  ASSERT_KVT_OK(kvt_connector_pause(r.c));
  std::thread engine([&] { r.match("C", seed_a()); });
  kvt_pause_info p{};
  p.struct_size = sizeof p;
  ASSERT_KVT_OK(kvt_connector_pause_wait(&p, r.c, 20'000'000'000));
  EXPECT_EQ(p.breakpoint, 0u);
  EXPECT_STREQ(p.req_id, "C");
  EXPECT_EQ(p.trigger, uint32_t(KVT_TRIGGER_GET_NUM_NEW_MATCHED_TOKENS));
  ASSERT_KVT_OK(kvt_connector_resume(r.c));
  engine.join();
  EXPECT_EQ(slot_state(r.c, "C"), uint32_t(KVT_SLOT_ONBOARD_STAGED)) << "A's blocks are in G2";

  // Bad arguments.
  EXPECT_KVT(kvt_connector_breakpoint_add(&bp, r.c, 0, nullptr), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_KVT(kvt_connector_breakpoint_add(&bp, r.c, 11, nullptr), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_KVT(kvt_connector_breakpoint_add(&bp, r.c, 0, ""), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_KVT(kvt_connector_breakpoint_add(nullptr, r.c, 1, nullptr), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_KVT(kvt_connector_breakpoint_remove(r.c, 12345), KVT_ERR_NOT_FOUND);
  EXPECT_KVT(kvt_connector_resume(r.c), KVT_ERR_STATE);
  EXPECT_KVT(kvt_connector_pause_wait(&p, r.c, 10'000'000), KVT_TIMEOUT);
  EXPECT_KVT(kvt_connector_set_pause_timeout(r.c, 0), KVT_ERR_INVALID_ARGUMENT);
  size_t n = 0;
  EXPECT_KVT(kvt_connector_slots(nullptr, 1, &n, r.c), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_KVT(kvt_connector_slots(nullptr, 0, nullptr, r.c), KVT_ERR_INVALID_ARGUMENT);
  p.struct_size = 8;
  EXPECT_KVT(kvt_connector_pause_wait(&p, r.c, 10'000'000), KVT_ERR_INVALID_ARGUMENT);
}

// A connector destroyed while a call is paused at a breakpoint lets the call finish first,
// rather than freeing the slots under it.
TEST(Breakpoints, DestroyResumesAPausedCallAndWaitsForIt) {
  auto m = make(seed_manager_config());
  kvt_connector *c = nullptr;
  kvt_connector_config cc = connector_config(KVT_ROLE_SCHEDULER);
  cc.pause_timeout_ms = 3600u * 1000u;  // only destroy can end this pause in time
  ASSERT_KVT_OK(kvt_connector_create(&c, m.get(), &cc));
  uint64_t bp = 0;
  ASSERT_KVT_OK(kvt_connector_breakpoint_add(&bp, c, KVT_SLOT_INITIALIZED, nullptr));
  std::atomic<kvt_status> st{KVT_ERR_INTERNAL};
  std::atomic<bool> returned{false};
  std::thread engine([&] {
    uint64_t n = 0;
    const auto tokens = seed_a();
    st = kvt_connector_get_num_new_matched_tokens(&n, nullptr, c, "A", tokens.data(),
                                                  tokens.size(), 0);
    returned = true;
  });
  kvt_pause_info p{};
  p.struct_size = sizeof p;
  ASSERT_KVT_OK(kvt_connector_pause_wait(&p, c, 20'000'000'000));
  EXPECT_EQ(p.state, uint32_t(KVT_SLOT_INITIALIZED));
  const auto t0 = std::chrono::steady_clock::now();
  kvt_connector_destroy(c);  // no resume: destroy's own
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
  // The call left the connector's lock before destroy freed it; at most its return remains.
  for (int i = 0; i < 1000 && !returned; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_TRUE(returned.load());
  engine.join();
  EXPECT_EQ(st.load(), KVT_OK);
}

// kvt_event_log_replay on seed 003's log: into a fresh manager, the same registry as the
// recorded one, every slot finished, every batch ended, the same transitions. A log with a
// record taken out is caught (a gap, and a slot that moves from where it is not).
TEST(Replay, SeedLogReplaysIntoAFreshManagerAndAMissingRecordIsCaught) {
  TempDir dir;
  const std::string log = dir.path + "/seed.kvtlog", cut = dir.path + "/cut.kvtlog";
  Rig r;
  ASSERT_KVT_OK(kvt_manager_recorder_open(r.m.get(), log.c_str()));
  run_seed(r);
  ASSERT_KVT_OK(kvt_manager_recorder_close(r.m.get()));

  auto fresh = make(seed_manager_config());
  kvt_log_replay out{};
  out.struct_size = sizeof out;
  ASSERT_KVT_OK(kvt_event_log_replay(&out, fresh.get(), log.c_str()));
  EXPECT_EQ(out.violations, 0u);
  EXPECT_EQ(out.torn, 0u);
  EXPECT_EQ(out.live_slots, 0u);
  EXPECT_EQ(out.finished_slots, 2u);
  EXPECT_EQ(out.open_batches, 0u);
  EXPECT_EQ(out.loaded_blocks, 2u);
  EXPECT_EQ(out.registered[KVT_TIER_G2], 3u);
  kvt_connector_stats s = r.stats();
  EXPECT_EQ(std::memcmp(out.transitions, s.transitions, sizeof s.transitions), 0);
  auto hashes = [](kvt_manager *m, kvt_tier t) {
    size_t n = 0;
    EXPECT_EQ(kvt_tier_hashes(nullptr, 0, &n, m, t), KVT_OK) << kvt_last_error();
    std::vector<uint64_t> h(n);
    EXPECT_EQ(kvt_tier_hashes(h.data(), h.size(), &n, m, t), KVT_OK);
    return std::set<uint64_t>(h.begin(), h.end());
  };
  auto hb = hashes_of(seed_b());
  EXPECT_EQ(hashes(fresh.get(), KVT_TIER_G2), std::set<uint64_t>(hb.begin(), hb.end()));
  EXPECT_EQ(hashes(fresh.get(), KVT_TIER_G2), hashes(r.m.get(), KVT_TIER_G2));
  kvt_log_replay again{};
  again.struct_size = sizeof again;
  EXPECT_KVT(kvt_event_log_replay(&again, fresh.get(), log.c_str()), KVT_ERR_CORRUPT);
  EXPECT_NE(std::string(kvt_last_error()).find("it is not fresh"), std::string::npos)
      << kvt_last_error();

  // Take out the first SLOT record after the header: B's or A's history breaks there.
  const std::string bytes = slurp(log);
  const size_t first = 16, len = 8 + (uint8_t(bytes[first]) | uint8_t(bytes[first + 1]) << 8);
  spit(cut, bytes.substr(0, first) + bytes.substr(first + len));
  kvt_log_replay bad{};
  bad.struct_size = sizeof bad;
  EXPECT_KVT(kvt_event_log_replay(&bad, nullptr, cut.c_str()), KVT_ERR_CORRUPT);
  EXPECT_GT(bad.violations, 0u);
  const std::string why = kvt_last_error();
  EXPECT_NE(why.find("request 'A' moves from"), std::string::npos) << why;

  EXPECT_KVT(kvt_event_log_replay(nullptr, nullptr, log.c_str()), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_KVT(kvt_event_log_replay(&bad, nullptr, nullptr), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_KVT(kvt_event_log_replay(&bad, nullptr, (dir.path + "/none").c_str()), KVT_ERR_IO);
  bad.struct_size = 4;
  EXPECT_KVT(kvt_event_log_replay(&bad, nullptr, log.c_str()), KVT_ERR_INVALID_ARGUMENT);
  size_t n = 0;
  EXPECT_KVT(kvt_tier_hashes(nullptr, 0, &n, r.m.get(), KVT_TIER_G4), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_KVT(kvt_tier_hashes(nullptr, 1, &n, r.m.get(), KVT_TIER_G2), KVT_ERR_INVALID_ARGUMENT);
}

// kvt_event_log_rerun: seed 003's calls, a refused call and a request left staged, made
// again from the log on a fresh scheduler-only connector: the same slots, registry and
// counters as the recorded connector. The same log on a connector with another salt, or on
// one that has run it already, differs, and the first difference is named.
TEST(Replay, RerunMakesTheRecordedCallsAgainOnAFreshConnector) {
  TempDir dir;
  const std::string log = dir.path + "/seed.kvtlog";
  Rig r;
  ASSERT_KVT_OK(kvt_manager_recorder_open(r.m.get(), log.c_str()));
  run_seed(r);
  EXPECT_KVT(r.alloc("nobody", {1}, 0), KVT_ERR_NOT_FOUND);
  EXPECT_EQ(r.match("C", seed_b()).first, 48u);
  ASSERT_KVT_OK(kvt_manager_recorder_close(r.m.get()));

  kvt_status end;
  size_t calls = 0;
  for (const kvt_obs_event &e : read_log(log, &end)) {
    if (e.kind != KVT_OBS_CALL) continue;
    ++calls;
    if (e.trigger == KVT_TRIGGER_UPDATE_STATE_AFTER_ALLOC && std::string(e.req_id) == "nobody") {
      EXPECT_EQ(e.status, KVT_ERR_NOT_FOUND);
    }
    if (e.trigger == KVT_TRIGGER_GET_NUM_NEW_MATCHED_TOKENS && std::string(e.req_id) == "C") {
      EXPECT_EQ(e.count, 48u) << "the call's result";
      EXPECT_EQ(e.tokens, seed_b().size());
      EXPECT_GT(e.bytes, 0u) << "its arguments are in the log";
    }
  }
  EXPECT_EQ(end, KVT_ITEROVER);

  kvt_connector_config cc = connector_config();
  cc.role = KVT_ROLE_SCHEDULER;
  Rig fresh(cc);
  kvt_log_replay out{};
  out.struct_size = sizeof out;
  ASSERT_KVT_OK(kvt_event_log_rerun(&out, fresh.c, log.c_str()));
  EXPECT_EQ(out.calls, calls);
  EXPECT_EQ(out.violations, 0u);
  EXPECT_EQ(out.live_slots, 1u);
  EXPECT_EQ(slot_state(fresh.c, "C"), uint32_t(KVT_SLOT_ONBOARD_STAGED));
  EXPECT_EQ(history(fresh.c, "B"), history(r.c, "B"));
  kvt_connector_stats a = r.stats(), b = fresh.stats();
  EXPECT_EQ(std::memcmp(&a, &b, sizeof a), 0) << "the same counters";
  size_t n1 = 0, n2 = 0;
  std::vector<uint64_t> h1(16), h2(16);
  ASSERT_KVT_OK(kvt_tier_hashes(h1.data(), h1.size(), &n1, r.m.get(), KVT_TIER_G2));
  ASSERT_KVT_OK(kvt_tier_hashes(h2.data(), h2.size(), &n2, fresh.m.get(), KVT_TIER_G2));
  h1.resize(n1);
  h2.resize(n2);
  EXPECT_EQ(n1, 3u);
  EXPECT_EQ(std::set<uint64_t>(h1.begin(), h1.end()), std::set<uint64_t>(h2.begin(), h2.end()));

  kvt_log_replay again{};
  again.struct_size = sizeof again;
  EXPECT_KVT(kvt_event_log_rerun(&again, fresh.c, log.c_str()), KVT_ERR_CORRUPT);
  EXPECT_GT(again.violations, 0u);

  cc.salt_hash ^= 1;  // other hashes: A's first step stores other hashes than recorded
  Rig salted(cc);
  EXPECT_KVT(kvt_event_log_rerun(&again, salted.c, log.c_str()), KVT_ERR_CORRUPT);
  const std::string why = kvt_last_error();
  EXPECT_NE(why.find(": call 3 (BUILD_CONNECTOR_META): "), std::string::npos) << why;
  EXPECT_NE(why.find("the metadata differs from the recorded one"), std::string::npos) << why;

  kvt_connector_config wc = connector_config();
  wc.role = KVT_ROLE_WORKER;
  Rig worker(wc);
  EXPECT_KVT(kvt_event_log_rerun(&again, worker.c, log.c_str()), KVT_ERR_STATE);
  EXPECT_KVT(kvt_event_log_rerun(nullptr, fresh.c, log.c_str()), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_KVT(kvt_event_log_rerun(&again, nullptr, log.c_str()), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_KVT(kvt_event_log_rerun(&again, fresh.c, (dir.path + "/none").c_str()), KVT_ERR_IO);
}

// The connector's config opens the management endpoint for the connector's life and sets
// the pause timeout; bad values are refused by name, and a refused create leaves the manager
// free for another connector.
TEST(Observe, ConnectorConfigServesTheEndpointAndSetsThePauseTimeout) {
  TempDir dir;
  const std::string sock = dir.path + "/k.sock";
  kvt_connector_config cc = connector_config();
  cc.endpoint_path = sock.c_str();
  cc.pause_timeout_ms = 40;
  {
    Rig r(cc);
    ASSERT_NE(r.c, nullptr);
    EXPECT_EQ(r.match("A", seed_a()).first, 0u);
    const std::string reply = ask_endpoint(sock, "{\"cmd\": \"slots\"}\n");
    EXPECT_NE(reply.find("\"req_id\":\"A\""), std::string::npos) << reply;
    EXPECT_NE(reply.find("\"state\":\"INITIALIZED\""), std::string::npos) << reply;
    EXPECT_NE(ask_endpoint(sock, "nonsense\n").find("\"error\""), std::string::npos);

    uint64_t bp = 0;
    ASSERT_KVT_OK(kvt_connector_breakpoint_add(&bp, r.c, 0, "B"));
    const auto t0 = std::chrono::steady_clock::now();
    r.match("B", seed_b());  // paused at its start, released by the config's 40 ms
    const auto took = std::chrono::steady_clock::now() - t0;
    EXPECT_GE(took, std::chrono::milliseconds(40));
    EXPECT_LT(took, std::chrono::seconds(10)) << "not the default 30 s";
  }
  EXPECT_FALSE(std::ifstream(sock).good()) << "the connector's destroy removes its socket";

  auto m = make(seed_manager_config());
  kvt_connector *c = nullptr;
  cc.pause_timeout_ms = 0;
  EXPECT_KVT(kvt_connector_create(&c, m.get(), &cc), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kvt_last_error()).find("pause_timeout_ms"), std::string::npos);
  cc.pause_timeout_ms = 3600u * 1000u + 1;
  EXPECT_KVT(kvt_connector_create(&c, m.get(), &cc), KVT_ERR_INVALID_ARGUMENT);
  cc.pause_timeout_ms = 100;
  cc.endpoint_path = "";
  EXPECT_KVT(kvt_connector_create(&c, m.get(), &cc), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kvt_last_error()).find("endpoint_path"), std::string::npos);
  spit(sock, "in the way");
  cc.endpoint_path = sock.c_str();
  EXPECT_NE(kvt_connector_create(&c, m.get(), &cc), KVT_OK);
  EXPECT_NE(std::string(kvt_last_error()).find("cfg->endpoint_path"), std::string::npos)
      << kvt_last_error();
  cc.endpoint_path = nullptr;
  ASSERT_KVT_OK(kvt_connector_create(&c, m.get(), &cc));  // the refused creates let go
  kvt_connector_destroy(c);
}

// Issue 24, finding 1: bytes that are not UTF-8, in a request line or in a request id (which
// kvtier does not check), are replaced in the endpoint's replies; they used to make its
// thread throw, which ended the serving process.
TEST(Observe, EndpointRepliesToBytesThatAreNotUtf8) {
  TempDir dir;
  const std::string sock = dir.path + "/k.sock";
  kvt_connector_config cc = connector_config();
  cc.endpoint_path = sock.c_str();
  Rig r(cc);
  ASSERT_NE(r.c, nullptr);
  std::string reply = ask_endpoint(sock, "\xff\xfe\n");
  EXPECT_NE(reply.find("\"ok\":false"), std::string::npos) << reply;
  EXPECT_NE(reply.find("\xef\xbf\xbd"), std::string::npos) << "no U+FFFD in " << reply;
  const std::string id = "req-\xff\xc0-1";
  EXPECT_EQ(r.match(id, seed_a()).first, 0u);
  reply = ask_endpoint(sock, "{\"cmd\": \"slots\"}\n");
  EXPECT_NE(reply.find("\"req_id\":\"req-\xef\xbf\xbd\xef\xbf\xbd-1\""), std::string::npos) << reply;
  reply = ask_endpoint(sock, "{\"cmd\": \"timeline\", \"req_id\": \"req-\xef\xbf\xbd\"}\n");
  EXPECT_NE(reply.find("\"ok\":true"), std::string::npos) << reply;
  EXPECT_EQ(r.finish(id), 0);
  EXPECT_NE(ask_endpoint(sock, "{\"cmd\": \"tiers\"}\n").find("\"ok\":true"), std::string::npos)
      << "the endpoint stopped answering";
}

// The observe events a manager has emitted, from its metrics.
static uint64_t events_emitted(kvt_manager *m) {
  size_t len = 0;
  kvt_metrics_text(nullptr, 0, &len, m, nullptr);  // the length only
  std::string text(len + 1, '\0');
  EXPECT_KVT(kvt_metrics_text(text.data(), text.size(), &len, m, nullptr), KVT_OK);
  const std::string key = "\nkvtier_events_emitted_total ";
  const size_t at = text.find(key);
  EXPECT_NE(at, std::string::npos) << text;
  return at == std::string::npos ? 0 : std::stoull(text.substr(at + key.size()));
}

// Issue 25: an endpoint that no client has asked anything records no timeline, so the
// observe stream stays off and the engine's calls pay one branch for it. A client's first
// request starts the record: the requests seen from then on have a timeline, the ones
// before have none.
TEST(Observe, AnEndpointNobodyWatchesLeavesTheStreamOffUntilAClientComes) {
  TempDir dir;
  const std::string sock = dir.path + "/k.sock";
  kvt_connector_config cc = connector_config();
  cc.endpoint_path = sock.c_str();
  Rig r(cc);
  ASSERT_NE(r.c, nullptr);
  r.run_a();
  EXPECT_EQ(events_emitted(r.m.get()), 0u) << "the stream was on with nobody watching";

  std::string reply = ask_endpoint(sock, "{\"cmd\": \"timeline\", \"req_id\": \"A\"}\n");
  EXPECT_NE(reply.find("\"events\":[]"), std::string::npos) << reply;
  EXPECT_NE(reply.find("\"recorded_since_ns\":"), std::string::npos) << reply;
  EXPECT_EQ(r.match("B", seed_b()).first, 32u);
  EXPECT_GT(events_emitted(r.m.get()), 0u);
  reply = ask_endpoint(sock, "{\"cmd\": \"timeline\", \"req_id\": \"B\"}\n");
  EXPECT_NE(reply.find("\"kind\":\"CALL\""), std::string::npos) << reply;
  EXPECT_NE(reply.find("\"to\":"), std::string::npos) << "no SLOT event: " << reply;
}

// kvt_obs_event_json is the one mapping of events to JSON: names for kinds, states, tiers and
// statuses, the keys of each kind, and the endpoint's timeline sends the same objects.
TEST(Observe, EventsAsJsonAreOneMappingForTheCallAndTheEndpoint) {
  using nlohmann::json;
  auto as_json = [](const kvt_obs_event &e) {
    size_t len = 0;
    EXPECT_KVT(kvt_obs_event_json(nullptr, 0, &len, &e), KVT_OK);
    std::string text(len + 1, 'x');
    EXPECT_KVT(kvt_obs_event_json(text.data(), text.size(), &len, &e), KVT_OK);
    EXPECT_EQ(text[len], '\0');
    text.resize(len);
    return json::parse(text);
  };
  kvt_obs_event e{};
  e.seq = 7;
  e.time_ns = 123;
  e.kind = KVT_OBS_SLOT;
  e.prev = 0;
  e.state = KVT_SLOT_ONBOARDING;
  e.trigger = KVT_TRIGGER_UPDATE_STATE_AFTER_ALLOC;
  e.tokens = 40;
  std::snprintf(e.req_id, sizeof e.req_id, "req-1");
  EXPECT_EQ(as_json(e), json::parse(R"({"seq":7,"time_ns":123,"kind":"SLOT","req_id":"req-1",
      "from":"-","to":"ONBOARDING","trigger":"UPDATE_STATE_AFTER_ALLOC","tokens":40,
      "computed":0})"));
  e = kvt_obs_event{};
  e.kind = KVT_OBS_TRANSFER;
  e.src = KVT_TIER_G1;
  e.dst = KVT_TIER_G4;
  e.status = KVT_ERR_IO;
  e.blocks = 3;
  EXPECT_EQ(as_json(e), json::parse(R"({"seq":0,"time_ns":0,"kind":"TRANSFER","src":"G1",
      "dst":"G4","status":"KVT_ERR_IO","batch":0,"blocks":3,"bytes":0,"duration_ns":0})"));
  e = kvt_obs_event{};
  e.kind = KVT_OBS_BLOCK_STORED;
  e.dst = KVT_TIER_G2;
  e.hash = 5;
  e.parent_hash = 4;
  EXPECT_EQ(as_json(e), json::parse(R"({"seq":0,"time_ns":0,"kind":"BLOCK_STORED",
      "parent_hash":4,"hash":5,"tier":"G2"})"));
  e = kvt_obs_event{};
  e.kind = 99;  // a newer library's kind
  e.count = 2;
  EXPECT_EQ(as_json(e)["count"], 2);
  // An id of the engine's bytes: not UTF-8 is replaced, and one without a NUL ends at its array.
  e = kvt_obs_event{};
  e.kind = KVT_OBS_DROPPED;
  std::memset(e.req_id, 0xff, sizeof e.req_id);
  EXPECT_EQ(as_json(e)["req_id"].get<std::string>().size(), 3 * sizeof e.req_id);

  size_t len = 0;
  char small[8];
  EXPECT_KVT(kvt_obs_event_json(small, sizeof small, &len, &e), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_GT(len, sizeof small);
  EXPECT_NE(std::string(kvt_last_error()).find("kvt_obs_event_json"), std::string::npos);
  EXPECT_KVT(kvt_obs_event_json(small, sizeof small, nullptr, &e), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_KVT(kvt_obs_event_json(small, sizeof small, &len, nullptr), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_KVT(kvt_obs_event_json(nullptr, 4, &len, &e), KVT_ERR_INVALID_ARGUMENT);

  // The endpoint's timeline: the same objects as the call makes of a subscriber's events.
  TempDir dir;
  const std::string sock = dir.path + "/k.sock";
  kvt_connector_config cc = connector_config();
  cc.endpoint_path = sock.c_str();
  Rig r(cc);
  ASSERT_NE(r.c, nullptr);
  kvt_subscription *sub = nullptr;
  ASSERT_KVT_OK(kvt_subscription_create(&sub, r.m.get(), 4096));
  ask_endpoint(sock, "{\"cmd\": \"tiers\"}\n");  // a client: the timeline is recorded
  run_seed(r);
  std::map<uint64_t, json> by_seq;
  for (const kvt_obs_event &ev : drain_all(sub)) by_seq[ev.seq] = as_json(ev);
  kvt_subscription_destroy(sub);
  const json reply =
      json::parse(ask_endpoint(sock, "{\"cmd\": \"timeline\", \"req_id\": \"B\"}\n"));
  ASSERT_TRUE(reply["ok"].get<bool>()) << reply;
  ASSERT_GT(reply["events"].size(), 3u) << reply;
  for (const json &ev : reply["events"]) {
    ASSERT_TRUE(by_seq.count(ev["seq"].get<uint64_t>())) << ev;
    EXPECT_EQ(ev, by_seq[ev["seq"].get<uint64_t>()]);
  }
}

// Each breakpoint is checked on every scheduler call, and the endpoint lets its clients add
// them: at most KVT_MAX_BREAKPOINTS are set, from the API and the endpoint alike. They used
// to grow without a bound.
TEST(Breakpoints, AtMostKvtMaxBreakpointsFromTheApiOrTheEndpoint) {
  TempDir dir;
  const std::string sock = dir.path + "/k.sock";
  kvt_connector_config cc = connector_config();
  cc.endpoint_path = sock.c_str();
  Rig r(cc);
  ASSERT_NE(r.c, nullptr);
  uint64_t id = 0, first = 0;
  // A number is a state only whole: 2^32 + 3 is not ONBOARDING.
  std::string big = ask_endpoint(sock, "{\"cmd\": \"break\", \"state\": 4294967299}\n");
  EXPECT_NE(big.find("not a slot state"), std::string::npos) << big;
  for (int i = 0; i < KVT_MAX_BREAKPOINTS - 1; ++i) {
    const std::string req = "r" + std::to_string(i);
    ASSERT_KVT_OK(kvt_connector_breakpoint_add(&id, r.c, KVT_SLOT_FINISHED, req.c_str()));
    if (i == 0) first = id;
  }
  std::string reply = ask_endpoint(sock, "{\"cmd\": \"break\", \"req_id\": \"last\"}\n");
  EXPECT_NE(reply.find("\"ok\":true"), std::string::npos) << reply;
  reply = ask_endpoint(sock, "{\"cmd\": \"break\", \"req_id\": \"more\"}\n");
  EXPECT_NE(reply.find("\"ok\":false"), std::string::npos) << reply;
  EXPECT_NE(reply.find("1024 breakpoints are set already"), std::string::npos) << reply;
  EXPECT_KVT(kvt_connector_breakpoint_add(&id, r.c, KVT_SLOT_FINISHED, "more"), KVT_ERR_NO_SPACE);
  EXPECT_NE(std::string(kvt_last_error()).find("1024 breakpoints are set already"),
            std::string::npos);
  ASSERT_KVT_OK(kvt_connector_breakpoint_remove(r.c, first));
  ASSERT_KVT_OK(kvt_connector_breakpoint_add(&id, r.c, KVT_SLOT_FINISHED, "more"));
  reply = ask_endpoint(sock, "{\"cmd\": \"clear\"}\n");
  EXPECT_NE(reply.find("\"ok\":true"), std::string::npos) << reply;
  reply = ask_endpoint(sock, "{\"cmd\": \"break\", \"state\": \"FINISHED\"}\n");
  EXPECT_NE(reply.find("\"ok\":true"), std::string::npos) << "clear frees them all: " << reply;
}

// kvt_connector_set_hooks: will_call and finished_call pair up around each of the six
// scheduler calls, with the call's status; transition sees every slot move, in order.
TEST(Hooks, InterceptorsSeeEveryCallAndTransition) {
  struct Seen {
    std::vector<std::string> calls;
    std::map<std::string, std::vector<std::string>> moves;
    int open = 0;
    bool nested = false;
  } seen;
  kvt_connector_hooks h{};
  h.struct_size = sizeof h;
  h.user = &seen;
  h.will_call = [](void *u, uint32_t trigger, const char *id) {
    auto *s = static_cast<Seen *>(u);
    s->nested |= s->open++ != 0;
    s->calls.push_back(std::string("will ") + kvt_obs_trigger_str(trigger) + " " + (id ? id : "-"));
  };
  h.finished_call = [](void *u, uint32_t trigger, const char *id, kvt_status st) {
    auto *s = static_cast<Seen *>(u);
    --s->open;
    s->calls.push_back(std::string("done ") + kvt_obs_trigger_str(trigger) + " " +
                       (id ? id : "-") + " " + kvt_status_str(st));
  };
  h.transition = [](void *u, const char *id, uint32_t from, uint32_t to, uint32_t) {
    auto &m = static_cast<Seen *>(u)->moves[id];
    if (m.empty()) m.push_back(from ? kvt_slot_state_str(from) : "NEW");
    if (m.back() != kvt_slot_state_str(to)) m.push_back(kvt_slot_state_str(to));
  };
  Rig r;
  ASSERT_KVT_OK(kvt_connector_set_hooks(r.c, &h));
  run_seed(r);
  int32_t delay = 0;
  EXPECT_KVT(kvt_connector_request_finished(&delay, r.c, "nobody"), KVT_ERR_NOT_FOUND);
  EXPECT_FALSE(seen.nested);
  EXPECT_EQ(seen.open, 0);
  ASSERT_GE(seen.calls.size(), 6u);
  EXPECT_EQ(seen.calls[0], "will GET_NUM_NEW_MATCHED_TOKENS A");
  EXPECT_EQ(seen.calls[1], "done GET_NUM_NEW_MATCHED_TOKENS A KVT_OK");
  EXPECT_EQ(seen.calls.back(), "done REQUEST_FINISHED nobody KVT_ERR_NOT_FOUND");
  EXPECT_NE(std::find(seen.calls.begin(), seen.calls.end(), "will BUILD_CONNECTOR_META -"),
            seen.calls.end());
  EXPECT_NE(std::find(seen.calls.begin(), seen.calls.end(), "will UPDATE_CONNECTOR_OUTPUT -"),
            seen.calls.end());
  auto b = history(r.c, "B");
  b.insert(b.begin(), "NEW");
  EXPECT_EQ(seen.moves["B"], b);

  const size_t before = seen.calls.size();
  ASSERT_KVT_OK(kvt_connector_set_hooks(r.c, nullptr));
  r.match("C", seed_a());
  EXPECT_EQ(seen.calls.size(), before) << "removed hooks still ran";
  h.struct_size = 8;
  EXPECT_KVT(kvt_connector_set_hooks(r.c, &h), KVT_ERR_INVALID_ARGUMENT);
}
