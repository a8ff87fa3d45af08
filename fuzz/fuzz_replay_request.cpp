// fuzz_replay_request: arbitrary messages on the KV-event publisher's replay socket. The pure
// parser (src/kv_events/replay_request.cpp) accepts exactly vLLM's request and kvtier's
// snapshot request; then the same frames go from a DEALER to a real publisher (src/kv_events,
// compiled into this binary) over ipc://, and its answers keep the protocol and the budgets
// (docs/KV_EVENTS.md, Replay and Snapshots): each answered request gets kept batches from
// its start, in order, the bytes published, or its snapshot, then END_SEQ; an ignored or
// dropped one nothing; never more in flight than the budgets; and once the client is gone,
// nothing counted in flight.
#include <stdlib.h>
#include <unistd.h>
#include <zmq.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "input.hpp"
#include "kv_events/publisher.hpp"
#include "kv_events/replay_request.hpp"

using namespace kvt::pub;

namespace {

void check(bool ok, const char *what) {
  if (ok) return;
  std::fprintf(stderr, "fuzz_replay_request: %s\n", what);
  std::abort();
}

template <class F>
void within_seconds(F done, const char *what) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!done()) {
    check(std::chrono::steady_clock::now() < deadline, what);
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

using Frames = std::vector<std::string>;

bool recv_frames(void *s, Frames *out, int timeout_ms) {
  out->clear();
  zmq_pollitem_t item{s, 0, ZMQ_POLLIN, 0};
  if (zmq_poll(&item, 1, timeout_ms) <= 0) return false;
  for (bool more = true; more;) {
    zmq_msg_t m;
    zmq_msg_init(&m);
    check(zmq_msg_recv(&m, s, 0) >= 0, "recv");
    out->emplace_back(static_cast<const char *>(zmq_msg_data(&m)), zmq_msg_size(&m));
    more = zmq_msg_more(&m);
    zmq_msg_close(&m);
  }
  return true;
}

void send_frames(void *s, const Frames &f) {
  for (size_t i = 0; i < f.size(); ++i)
    zmq_send(s, f[i].data(), f[i].size(), i + 1 < f.size() ? ZMQ_SNDMORE : 0);
}

std::string be64(uint64_t v) {
  std::string s(8, '\0');
  put_be64(reinterpret_cast<unsigned char *>(s.data()), v);
  return s;
}

// One reply: its batches (seq, payload) up to END_SEQ.
using Reply = std::vector<std::pair<uint64_t, std::string>>;
Reply read_reply(void *d) {
  Reply r;
  Frames f;
  for (;;) {
    check(recv_frames(d, &f, 30000), "an answered request without END_SEQ");
    check(f.size() == 4 && f[0].empty() && f[2].size() == 8, "a reply of another shape");
    if (f[2] == be64(~uint64_t{0})) {
      check(f[1].empty() && f[3].empty(), "END_SEQ with a topic or a payload");
      return r;
    }
    check(f[1] == "kv", "a batch without its topic");
    r.emplace_back(get_be64(reinterpret_cast<const unsigned char *>(f[2].data())), f[3]);
  }
}

// A publisher keeping kKept batches of growing size, and its client context.
constexpr uint64_t kKept = 6;
struct World {
  World() {
    char tmpl[] = "/tmp/kvt-fuzz-replay-XXXXXX";
    check(mkdtemp(tmpl) != nullptr, "mkdtemp");
    dir = tmpl;
    endpoint = "ipc://" + dir + "/replay";
    PublisherConfig c{"ipc://" + dir + "/pub", endpoint, "kv", 16, 0, 1u << KVT_TIER_G1,
                      4, 64, KVT_KV_EVENTS_FORMAT_CURRENT};
    check(Publisher::create(&pub, c) == KVT_OK, "Publisher::create");
    for (uint64_t k = 0; k < kKept; ++k) {
      std::vector<kvt_event> ev(1 + 2000 * k);
      for (size_t i = 0; i < ev.size(); ++i) {
        ev[i] = kvt_event{};
        ev[i].type = KVT_EVENT_BLOCK_STORED;
        ev[i].tier = KVT_TIER_G1;
        ev[i].hash = (k + 1) << 32 | i;
      }
      pub->publish(ev.data(), ev.size());
      within_seconds([&] { return replay_stats(*pub).kept_batches == k + 1; }, "not kept");
    }
    ctx = zmq_ctx_new();
    void *d = open(1000);
    send_frames(d, {"", be64(0)});
    kept = read_reply(d);
    zmq_close(d);
    check(kept.size() == kKept, "the setup's replay is not whole");
  }
  ~World() {
    pub.reset();
    zmq_ctx_term(ctx);
    std::string rm = "rm -rf " + dir;
    if (std::system(rm.c_str()) != 0) std::fprintf(stderr, "%s failed\n", rm.c_str());
  }
  void *open(int queue) const {
    void *d = zmq_socket(ctx, ZMQ_DEALER);
    int zero = 0;
    zmq_setsockopt(d, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(d, ZMQ_RCVHWM, &queue, sizeof queue);
    check(zmq_connect(d, endpoint.c_str()) == 0, "connect");
    return d;
  }
  std::string dir, endpoint;
  std::unique_ptr<Publisher> pub;
  void *ctx = nullptr;
  Reply kept;
};

// What `start` asks for: the kept batches from the first with seq >= start.
size_t first_index(const Reply &kept, uint64_t start) {
  return size_t(std::lower_bound(kept.begin(), kept.end(), start,
                                 [](const auto &b, uint64_t s) { return b.first < s; }) -
                kept.begin());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  kvt_fuzz::Input in(data, size);
  // Up to 4 messages of 1..4 frames (the ROUTER adds the identity), each frame up to 40
  // bytes (under ZMQ_MAXMSGSIZE, which would disconnect), often the 8 of a start.
  std::vector<Frames> msgs(1 + in.byte() % 4);
  for (Frames &m : msgs) {
    m.resize(1 + in.byte() % 4);
    for (std::string &f : m) {
      const uint8_t len = in.byte();
      f.resize(len & 0x80 ? 8 : len % 41);
      in.bytes(f.data(), f.size());
    }
  }
  const bool read_each = in.flag();  // or let the replies pile up first
  const int queue = in.flag() ? 1 : 1000;

  // The parser: exactly [identity of 1..255 bytes, anything, 8 bytes or KVTIER_SNAPSHOT].
  enum Kind { kInvalid, kReplay, kSnapshot };
  std::vector<Kind> kind;
  for (const Frames &m : msgs) {
    std::vector<std::string_view> v = {"id"};
    v.insert(v.end(), m.begin(), m.end());
    const ReplayRequest q = parse_replay_request(v.data(), v.size());
    const Kind want = v.size() != 3              ? kInvalid
                      : v[2] == kSnapshotRequest ? kSnapshot
                      : v[2].size() == 8         ? kReplay
                                                 : kInvalid;
    check(q.ok == (want != kInvalid) && q.snapshot == (want == kSnapshot), "the parser's verdict");
    if (want == kReplay)
      check(q.start == get_be64(reinterpret_cast<const unsigned char *>(v[2].data())),
            "a start misread");
    if (want == kInvalid) check(q.why != nullptr, "a refusal without a reason");
    static const std::string too_long(256, 'i');
    for (std::string_view id : {std::string_view(), std::string_view(too_long)}) {
      v[0] = id;
      check(!parse_replay_request(v.data(), v.size()).ok, "an identity out of 1..255 bytes");
    }
    kind.push_back(want);
  }

  // The same messages to a real publisher.
  static World w;
  const ReplayStats s0 = replay_stats(*w.pub);
  void *d = w.open(queue);
  std::vector<Reply> replies;
  uint64_t sent = 0;
  auto answered = [&] {
    const ReplayStats s = replay_stats(*w.pub);
    return s.full + s.cut + s.snapshots + s.snapshots_refused - s0.full - s0.cut - s0.snapshots -
           s0.snapshots_refused;
  };
  auto settle = [&] {
    within_seconds([&] { return replay_stats(*w.pub).requests == s0.requests + sent; },
                   "a request never read");
    while (replies.size() < answered()) replies.push_back(read_reply(d));
  };
  for (const Frames &m : msgs) {
    send_frames(d, m);
    ++sent;
    if (read_each) settle();
  }
  settle();
  const ReplayStats s = replay_stats(*w.pub);
  check(s.malformed - s0.malformed == size_t(std::count(kind.begin(), kind.end(), kInvalid)),
        "malformed requests miscounted");
  check(s.full + s.cut + s.snapshots + s.snapshots_refused + s.dropped + s.malformed ==
            s0.full + s0.cut + s0.snapshots + s0.snapshots_refused + s0.dropped + s0.malformed +
                sent,
        "a request neither answered, ignored nor dropped");
  check(s.peak_client_bytes <= s.client_budget, "a client over its budget");
  check(s.peak_bytes <= s.total_budget, "all clients over the total budget");
  // Replies in request order, each the kept batches from its start (a prefix, when cut),
  // or a snapshot: one message (the publisher has no snapshot source: AllBlocksCleared
  // alone) numbered with the next seq, or nothing when refused.
  size_t next = 0;
  for (const Reply &r : replies) {
    bool matched = false, snapshot = false;
    for (; next < msgs.size() && !matched; ++next) {
      if (kind[next] == kInvalid) continue;
      if ((snapshot = kind[next] == kSnapshot)) {
        matched = r.empty() || (r.size() == 1 && r[0].first == kKept);
        continue;
      }
      const size_t i = first_index(w.kept, get_be64(reinterpret_cast<const unsigned char *>(
                                               msgs[next][1].data())));
      matched = r.empty() || (r.size() <= w.kept.size() - i && r[0].first == w.kept[i].first);
    }
    check(matched, "a reply that answers no request");
    if (snapshot) continue;
    for (size_t k = 0; k < r.size(); ++k) {
      const size_t i = first_index(w.kept, r[0].first) + k;
      check(r[k] == w.kept[i], "a batch out of order, or not the bytes kept");
    }
  }
  // Once it read them all, nothing more comes: a request for nothing gets END_SEQ alone.
  send_frames(d, {"", be64(~uint64_t{0})});
  ++sent;
  within_seconds([&] { return replay_stats(*w.pub).requests == s0.requests + sent; },
                 "the last request never read");
  check(read_reply(d).empty(), "a reply more than the answered requests");
  zmq_close(d);
  within_seconds([&] { return replay_stats(*w.pub).bytes == 0; },
                 "bytes in flight once the client is gone");
  return 0;
}
