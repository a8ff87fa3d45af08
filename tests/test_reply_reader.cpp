// G4's RESP reader (src/remote/reply_reader) on bytes cut at every boundary, on hostile
// streams, and through a real socket to a server that answers with lies (a thread of this
// test that speaks TCP); Redis Cluster's slots, slot maps and redirections
// (src/remote/slot_map) on Redis's own examples and on lies. The store against a real
// redis-server is test_g4_client's, against a real cluster test_g4_cluster's.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/error.hpp"
#include "remote/reply_reader.hpp"
#include "remote/slot_map.hpp"
#include "remote/store.hpp"

namespace {

using kvt::remote::Reply;
using kvt::remote::ReplyReader;
using Kind = Reply::Kind;

// Hands out a string's bytes at most `chunk` at a time, scattering them over the iovecs as
// readv would, and remembers how far it was read.
class MemorySource final : public kvt::remote::ByteSource {
 public:
  MemorySource(std::string bytes, size_t chunk) : bytes_(std::move(bytes)), chunk_(chunk) {}
  ssize_t read(const iovec *iov, int n) override {
    EXPECT_GE(n, 1);
    size_t left = std::min(chunk_, bytes_.size() - at_), done = 0;
    for (int i = 0; i < n && left > 0; ++i) {
      EXPECT_GT(iov[i].iov_len, 0u) << "an empty iovec";
      size_t c = std::min(left, iov[i].iov_len);
      std::memcpy(iov[i].iov_base, bytes_.data() + at_, c);
      at_ += c, done += c, left -= c;
    }
    return ssize_t(done);
  }
  size_t consumed() const { return at_; }

 private:
  std::string bytes_;
  size_t chunk_, at_ = 0;
};

std::string bulk(const std::string &s) {
  return "$" + std::to_string(s.size()) + "\r\n" + s + "\r\n";
}

std::string pattern(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (char &c : s) c = char(rng());
  return s;
}

// Every reply kind, a bulk placed into a two-part target, one kept, one skipped, and a
// placed bulk bigger than the reader's buffer: the same replies whatever the source's cuts.
TEST(ReplyReader, EveryReplyWhereverTheBytesAreCut) {
  const std::string head = pattern(64, 1), body = pattern(100, 2), big = pattern(200000, 3);
  const std::string kept = pattern(4096, 4), skipped = pattern(5000, 5);
  const std::string stream = "+OK\r\n-ERR out of memory\r\n:42\r\n:-7\r\n$-1\r\n" +
                             bulk(head + body) + bulk(kept) + bulk(skipped) + bulk("") +
                             bulk(big) + ":1\r\n";
  for (size_t chunk : {size_t(1), size_t(2), size_t(3), size_t(7), size_t(64), size_t(4097),
                       size_t(65536), stream.size()}) {
    SCOPED_TRACE("chunk " + std::to_string(chunk));
    MemorySource src(stream, chunk);
    ReplyReader r(src);
    Reply rep;
    ASSERT_EQ(r.next(&rep), KVT_OK) << kvt::last_error();
    EXPECT_EQ(rep.kind, Kind::kStatus);
    EXPECT_EQ(rep.text, "OK");
    ASSERT_EQ(r.next(&rep), KVT_OK);
    EXPECT_EQ(rep.kind, Kind::kError);
    EXPECT_EQ(rep.text, "ERR out of memory");
    ASSERT_EQ(r.next(&rep), KVT_OK);
    EXPECT_EQ(rep.kind, Kind::kInteger);
    EXPECT_EQ(rep.integer, 42);
    ASSERT_EQ(r.next(&rep), KVT_OK);
    EXPECT_EQ(rep.integer, -7);
    ASSERT_EQ(r.next(&rep), KVT_OK);
    EXPECT_EQ(rep.kind, Kind::kNil);

    std::string h(64, 'x'), d(100, 'x');
    iovec two[2] = {{h.data(), h.size()}, {d.data(), d.size()}};
    ASSERT_EQ(r.next(&rep, two, 2), KVT_OK);
    EXPECT_EQ(rep.kind, Kind::kBulk);
    EXPECT_TRUE(rep.placed);
    EXPECT_EQ(h, head);
    EXPECT_EQ(d, body);

    ASSERT_EQ(r.next(&rep, two, 2), KVT_OK);  // 4096 bytes: not the target's 164, kept
    EXPECT_FALSE(rep.placed);
    EXPECT_EQ(rep.length, kept.size());
    EXPECT_EQ(rep.text, kept);
    ASSERT_EQ(r.next(&rep, two, 2), KVT_OK);  // 5000 bytes: skipped, nothing kept
    EXPECT_FALSE(rep.placed);
    EXPECT_EQ(rep.length, skipped.size());
    EXPECT_TRUE(rep.text.empty());
    ASSERT_EQ(r.next(&rep), KVT_OK);
    EXPECT_EQ(rep.kind, Kind::kBulk);
    EXPECT_EQ(rep.length, 0u);

    std::string into(big.size(), 'x');
    iovec one{into.data(), into.size()};
    ASSERT_EQ(r.next(&rep, &one, 1), KVT_OK);
    EXPECT_TRUE(rep.placed);
    EXPECT_TRUE(into == big);
    ASSERT_EQ(r.next(&rep), KVT_OK);
    EXPECT_EQ(rep.integer, 1);
    EXPECT_EQ(src.consumed(), stream.size());
  }
}

// What kvtier never asks for, or what no server may send: KVT_ERR_IO with a message that
// quotes the bytes, after reading no more than a line's limit past them.
TEST(ReplyReader, HostileStreamsAreRefusedWithoutReadingOn) {
  struct Case {
    std::string bytes, says;
  } cases[] = {
      {"*1\r\n$1\r\na\r\n", "reply type"},
      {"_\r\n", "reply type"},
      {"%1\r\n", "reply type"},
      {"\r\n", "empty line"},
      {"+OK\n", "CRLF"},
      {"+O\rK\r\n", "CR inside"},
      {"+" + std::string(5000, 'a') + "\r\n", "over 4096"},
      {std::string(70000, 'a'), "over 4096"},
      {":12a\r\n", "malformed integer"},
      {":\r\n", "malformed integer"},
      {":99999999999999999999\r\n", "malformed integer"},
      {"$-2\r\n", "out of range"},
      {"$+3\r\nabc\r\n", "malformed bulk length"},
      {"$ 3\r\nabc\r\n", "malformed bulk length"},
      {"$536870913\r\n" + std::string(100, 'a'), "out of range"},
      {"$9223372036854775807\r\n", "out of range"},
      {"$3\r\nabcXY", "not followed by CRLF"},
      {"$3\r\nab", "closed the connection"},
      {"$40000\r\n" + std::string(40000, 'a'), "closed the connection"},
      {"$40000\r\n" + std::string(40000, 'a') + "\r", "closed the connection"},
      {"$40000\r\n" + std::string(1000, 'a'), "closed the connection"},
      {"", "closed the connection"},
      {"+O", "closed the connection"},
  };
  for (const Case &c : cases) {
    SCOPED_TRACE(c.bytes.substr(0, 40));
    for (size_t chunk : {size_t(1), size_t(65536)}) {
      MemorySource src(c.bytes, chunk);
      ReplyReader r(src);
      Reply rep;
      std::string into(40000, 'x');
      iovec one{into.data(), into.size()};
      EXPECT_EQ(r.next(&rep, &one, 1), KVT_ERR_IO);
      EXPECT_NE(std::string(kvt::last_error()).find(c.says), std::string::npos)
          << kvt::last_error();
      EXPECT_FALSE(rep.placed);
      EXPECT_LE(src.consumed(), ReplyReader::kBufferBytes + 200);
    }
  }
}

// A source that fails: its message stands.
TEST(ReplyReader, ASourceFailureIsTheReadersFailure) {
  struct Failing final : kvt::remote::ByteSource {
    ssize_t read(const iovec *, int) override {
      kvt::fail(KVT_ERR_IO, "the wire broke");
      return -1;
    }
  } src;
  ReplyReader r(src);
  Reply rep;
  EXPECT_EQ(r.next(&rep), KVT_ERR_IO);
  EXPECT_STREQ(kvt::last_error(), "the wire broke");
}

// A server of this test's own on loopback: it reads whatever comes, then sends `reply` one
// byte every `gap_ms` (0: at once) until the client hangs up.
class LyingServer {
 public:
  LyingServer(std::string reply, int gap_ms) : reply_(std::move(reply)), gap_ms_(gap_ms) {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr *>(&a), sizeof a), 0);
    EXPECT_EQ(listen(fd_, 4), 0);
    getsockname(fd_, reinterpret_cast<sockaddr *>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { serve(); });
  }
  ~LyingServer() {
    shutdown(fd_, SHUT_RDWR);
    thread_.join();
    close(fd_);
  }
  std::string url() const { return "redis://127.0.0.1:" + std::to_string(port_); }

 private:
  void serve() {
    int c = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) return;
    char buf[4096];
    if (recv(c, buf, sizeof buf, 0) > 0) {
      const size_t step = gap_ms_ > 0 ? 1 : reply_.size();
      for (size_t at = 0; at < reply_.size(); at += step) {
        if (send(c, reply_.data() + at, std::min(step, reply_.size() - at), MSG_NOSIGNAL) <= 0)
          break;
        if (gap_ms_ > 0) std::this_thread::sleep_for(std::chrono::milliseconds(gap_ms_));
      }
    }
    // Holds the connection until the client closes it.
    while (recv(c, buf, sizeof buf, 0) > 0) {
    }
    close(c);
  }

  std::string reply_;
  int gap_ms_;
  int fd_ = -1, port_ = 0;
  std::thread thread_;
};

kvt_status get_one(const std::string &url, uint64_t timeout_us, std::vector<uint8_t> *data) {
  kvt::remote::Config c;
  c.urls = {url};
  c.key_prefix = "kvtier";
  c.timeout_us = timeout_us;
  std::unique_ptr<kvt::remote::Store> store;
  EXPECT_EQ(kvt::remote::Store::create(&store, c), KVT_OK);
  kvt::remote::Get g{0x1234, 0, data->data(), data->size()};
  store->get(&g, 1);
  return g.status;
}

// A server that announces a value of the block's size and then sends it one byte at a time:
// the reply must come whole within g4_timeout_us, so the call ends after about the timeout
// (each byte comes well within it: a timeout per read would wait for all 16 KiB).
TEST(ReplyReader, ATricklingServerRunsIntoTheDeadline) {
  std::vector<uint8_t> data(16384, 0);
  LyingServer server("$" + std::to_string(64 + data.size()) + "\r\n" +
                         std::string(64 + data.size(), 'a') + "\r\n",
                     5);
  EXPECT_EQ(get_one(server.url(), 200000, &data), KVT_ERR_IO);
  EXPECT_NE(std::string(kvt::last_error()).find("timed out"), std::string::npos)
      << kvt::last_error();
}

// A server that announces a 1 GiB value, or sends something that is no reply: refused at
// once, nothing allocated for it, the block not written.
TEST(ReplyReader, AServerThatLiesIsRefused) {
  for (const std::string &reply : {std::string("$1073741824\r\n") + std::string(1000, 'a'),
                                  std::string("*2\r\n$1\r\na\r\n$1\r\nb\r\n"),
                                  std::string(8192, '+')}) {
    std::vector<uint8_t> data(4096, 0xee);
    LyingServer server(reply, 0);
    EXPECT_EQ(get_one(server.url(), 5000000, &data), KVT_ERR_IO);
    EXPECT_NE(std::string(kvt::last_error()).find("not a reply kvtier asked for"),
              std::string::npos)
        << kvt::last_error();
    EXPECT_EQ(data, std::vector<uint8_t>(4096, 0xee));
  }
}

// Redis Cluster's key slots, as its specification's examples give them: CRC16 of the key,
// or of its hash tag (the first {...} that is not empty).
TEST(ClusterSlots, KeysGoToTheSlotsRedisPutsThemIn) {
  using kvt::remote::key_slot;
  EXPECT_EQ(key_slot("123456789"), 0x31c3 & 16383);  // CRC16/XMODEM's check value
  EXPECT_EQ(key_slot("foo"), 12182);
  EXPECT_EQ(key_slot("bar"), 5061);
  EXPECT_EQ(key_slot("{user1000}.following"), key_slot("user1000"));
  EXPECT_EQ(key_slot("{user1000}.followers"), key_slot("user1000"));
  EXPECT_NE(key_slot("foo{}{bar}"), key_slot("bar"));  // an empty tag: the whole key
  EXPECT_EQ(key_slot("foo{{bar}}zap"), key_slot("{bar"));
  EXPECT_EQ(key_slot("foo{bar}{zap}"), key_slot("bar"));
  EXPECT_EQ(key_slot(""), 0);
}

TEST(ClusterSlots, RedirectionsAreReadAndLiesAreNot) {
  using kvt::remote::parse_redirect;
  kvt::remote::Redirect d;
  kvt::remote::Endpoint from;
  from.host = "10.0.0.9";
  from.port = 7000;
  ASSERT_TRUE(parse_redirect(&d, "MOVED 3999 127.0.0.1:6381", from));
  EXPECT_FALSE(d.ask);
  EXPECT_EQ(d.slot, 3999);
  EXPECT_EQ(d.to.name(), "redis://127.0.0.1:6381/0");
  ASSERT_TRUE(parse_redirect(&d, "ASK 16383 [::1]:7001", from));
  EXPECT_TRUE(d.ask);
  EXPECT_EQ(d.slot, 16383);
  EXPECT_EQ(d.to.name(), "redis://[::1]:7001/0");
  ASSERT_TRUE(parse_redirect(&d, "MOVED 1 :7002", from));  // a node without a known address
  EXPECT_EQ(d.to.name(), "redis://10.0.0.9:7002/0");
  for (const char *bad :
       {"MOVED 16384 127.0.0.1:6381", "MOVED -1 h:1", "MOVED 1 h:0", "MOVED 1 h:65536",
        "MOVED 1 h", "MOVED 1", "MOVED x h:1", "MOVED 1 h:1x", "MOVED 1 h/x:1", "ASK  1 h:1",
        "ERR MOVED 1 h:1", "MOVEDD 1 h:1", "OOM command not allowed", "MOVED 1 h h:1"})
    EXPECT_FALSE(parse_redirect(&d, bad, from)) << bad;
}

std::string resp_int(long long v) { return ":" + std::to_string(v) + "\r\n"; }
std::string node(const std::string &host, int port, const std::string &extra = "") {
  return "*" + std::to_string(extra.empty() ? 3 : 4) + "\r\n" + bulk(host) + resp_int(port) +
         bulk("0123456789abcdef0123456789abcdef01234567") + extra;
}

// CLUSTER SLOTS as Redis 7 sends it (a hostname in each node's metadata, replicas), read
// whatever the cuts; then maps that lie, each refused with a message.
TEST(ClusterSlots, ASlotMapIsReadAndALyingOneIsRefused) {
  const std::string meta = "*2\r\n" + bulk("hostname") + bulk("node-a");
  const std::string map =
      "*3\r\n"
      "*4\r\n" + resp_int(0) + resp_int(5460) + node("127.0.0.1", 7000, meta) +
      node("127.0.0.1", 7003) +
      "*3\r\n" + resp_int(5461) + resp_int(10922) + node("", 7001) +
      "*3\r\n" + resp_int(10923) + resp_int(16383) + node("127.0.0.1", 7000) + ":1\r\n";
  kvt::remote::Endpoint asked;
  asked.host = "127.0.0.2";
  asked.port = 7001;
  for (size_t chunk : {size_t(1), size_t(5), map.size()}) {
    MemorySource src(map, chunk);
    ReplyReader r(src);
    kvt::remote::SlotMap m;
    ASSERT_EQ(kvt::remote::read_slot_map(&m, r, asked), KVT_OK) << kvt::last_error();
    ASSERT_EQ(m.nodes.size(), 2u);
    EXPECT_EQ(m.nodes[0].name(), "redis://127.0.0.1:7000/0");
    EXPECT_EQ(m.nodes[1].name(), "redis://127.0.0.2:7001/0");  // "": the node asked
    EXPECT_EQ(m.owner[0], 0);
    EXPECT_EQ(m.owner[5460], 0);
    EXPECT_EQ(m.owner[5461], 1);
    EXPECT_EQ(m.owner[10922], 1);
    EXPECT_EQ(m.owner[10923], 0);
    EXPECT_EQ(m.owner[16383], 0);
    Reply after;  // the map was read to its end, and no further
    ASSERT_EQ(r.next(&after), KVT_OK);
    EXPECT_EQ(after.integer, 1);
  }
  const std::string deep = "*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n:1\r\n";
  struct Case {
    std::string bytes, says;
  } cases[] = {
      {"-ERR This instance has cluster support disabled\r\n", "cluster support disabled"},
      {":5\r\n", "not an array of slot ranges"},
      {"*1\r\n*2\r\n:0\r\n:1\r\n", "not [start, end, master"},
      {"*1\r\n*3\r\n:9\r\n:1\r\n" + node("h", 1), "out of order"},
      {"*1\r\n*3\r\n:0\r\n:16384\r\n" + node("h", 1), "outside 0..16383"},
      {"*1\r\n*3\r\n:-1\r\n:5\r\n" + node("h", 1), "outside 0..16383"},
      {"*1\r\n*3\r\n:0\r\n:5\r\n" + node("h", 0), "address or port"},
      {"*1\r\n*3\r\n:0\r\n:5\r\n" + node("h/x", 1), "address or port"},
      {"*1\r\n*3\r\n:0\r\n:5\r\n*2\r\n:1\r\n:1\r\n", "address or port"},
      {"*1\r\n*3\r\n:0\r\n:5\r\n*1\r\n" + bulk("h"), "not [address, port"},
      {"*1\r\n*4\r\n:0\r\n:5\r\n" + node("h", 1) + "*1\r\n" + deep, "deeper"},
      {"*99999999\r\n", "array length out of range"},
      {"*1\r\n*3\r\n:0\r\n", "closed the connection"},
  };
  for (const Case &c : cases) {
    SCOPED_TRACE(c.says);
    MemorySource src(c.bytes, 3);
    ReplyReader r(src);
    kvt::remote::SlotMap m;
    EXPECT_EQ(kvt::remote::read_slot_map(&m, r, asked), KVT_ERR_IO);
    EXPECT_NE(std::string(kvt::last_error()).find(c.says), std::string::npos)
        << kvt::last_error();
  }
  // More masters than any cluster has: refused when the 1025th comes, not grown without end.
  std::string many = "*1100\r\n";
  for (int i = 0; i < 1100; ++i)
    many += "*3\r\n" + resp_int(i) + resp_int(i) + node("10.0." + std::to_string(i / 250) +
                                                       "." + std::to_string(i % 250), 7000);
  MemorySource src(many, many.size());
  ReplyReader r(src);
  kvt::remote::SlotMap m;
  EXPECT_EQ(kvt::remote::read_slot_map(&m, r, asked), KVT_ERR_IO);
  EXPECT_NE(std::string(kvt::last_error()).find("more than 1024 masters"), std::string::npos)
      << kvt::last_error();
}

}  // namespace
