// G4's host names (src/remote/resolve.*): a numeric address needs no lookup, a name is looked
// up on a thread of its own, and a DNS that never answers costs its caller the deadline, not
// the lookup. The lookups here are stand-ins for getaddrinfo that answer as a DNS server
// would, or never until the test lets them.
#include <gtest/gtest.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "common/error.hpp"
#include "remote/resolve.hpp"

namespace {

using kvt::remote::Addresses;
using kvt::remote::lookups_running;
using kvt::remote::resolve;
using Clock = std::chrono::steady_clock;

std::atomic<int> g_calls{0};
std::mutex g_gate_mu;
std::condition_variable g_gate_cv;
bool g_gate_open = false;

// Every name is 127.0.0.1.
int answering_lookup(const char *, const char *service, const addrinfo *hints, addrinfo **res) {
  ++g_calls;
  return getaddrinfo("127.0.0.1", service, hints, res);
}

int nxdomain_lookup(const char *, const char *, const addrinfo *, addrinfo **) {
  ++g_calls;
  return EAI_NONAME;
}

// A DNS server that does not answer until the test opens the gate.
int stalled_lookup(const char *host, const char *service, const addrinfo *hints,
                   addrinfo **res) {
  ++g_calls;
  std::unique_lock lk(g_gate_mu);
  g_gate_cv.wait(lk, [] { return g_gate_open; });
  return answering_lookup(host, service, hints, res);
}

void set_gate(bool open) {
  {
    std::lock_guard lk(g_gate_mu);
    g_gate_open = open;
  }
  g_gate_cv.notify_all();
}

bool eventually(const std::function<bool()> &done) {
  const auto give_up = Clock::now() + std::chrono::seconds(60);
  while (!done()) {
    if (Clock::now() > give_up) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

Clock::time_point in_ms(int ms) { return Clock::now() + std::chrono::milliseconds(ms); }

}  // namespace

TEST(G4Resolve, NumericAddressesNeedNoLookup) {
  g_calls = 0;
  for (const char *host : {"127.0.0.1", "::1"}) {
    Addresses a;
    ASSERT_EQ(resolve(&a, host, 6379, in_ms(1000), answering_lookup), KVT_OK)
        << kvt::last_error();
    ASSERT_NE(a.get(), nullptr) << host;
    EXPECT_EQ(a.get()->ai_family, host[0] == ':' ? AF_INET6 : AF_INET) << host;
    EXPECT_EQ(a.get()->ai_socktype, SOCK_STREAM);
  }
  EXPECT_EQ(g_calls.load(), 0) << "a numeric address went to the lookup";
}

TEST(G4Resolve, ANameIsLookedUpAndItsFailureNamed) {
  g_calls = 0;
  Addresses a;
  ASSERT_EQ(resolve(&a, "cache.example", 6380, in_ms(10000), answering_lookup), KVT_OK)
      << kvt::last_error();
  EXPECT_EQ(g_calls.load(), 1);
  ASSERT_NE(a.get(), nullptr);
  ASSERT_EQ(a.get()->ai_family, AF_INET);
  const auto *in = reinterpret_cast<const sockaddr_in *>(a.get()->ai_addr);
  EXPECT_EQ(ntohs(in->sin_port), 6380);
  EXPECT_EQ(ntohl(in->sin_addr.s_addr), INADDR_LOOPBACK);

  Addresses none;
  EXPECT_EQ(resolve(&none, "nowhere.example", 6379, in_ms(10000), nxdomain_lookup), KVT_ERR_IO);
  const std::string why = kvt::last_error();
  EXPECT_NE(why.find("cannot resolve nowhere.example"), std::string::npos) << why;
  EXPECT_EQ(none.get(), nullptr);
  EXPECT_TRUE(eventually([] { return lookups_running() == 0; }));
}

// The caller gets its KVT_ERR_IO at its deadline while the lookup still hangs; lookups left
// hanging are capped, past which a name fails at once; once DNS answers they end by
// themselves and names resolve again.
TEST(G4Resolve, ADnsThatNeverAnswersCostsTheDeadlineNotTheLookup) {
  set_gate(false);
  g_calls = 0;
  Addresses a;
  EXPECT_EQ(resolve(&a, "stalled.example", 6379, in_ms(200), stalled_lookup), KVT_ERR_IO);
  std::string why = kvt::last_error();
  EXPECT_NE(why.find("cannot resolve stalled.example: timed out"), std::string::npos) << why;
  EXPECT_EQ(lookups_running(), 1u) << "the caller was held until the lookup ended";

  for (size_t i = 1; i < kvt::remote::kMaxStuckLookups; ++i)
    EXPECT_EQ(resolve(&a, "stalled.example", 6379, in_ms(1), stalled_lookup), KVT_ERR_IO);
  EXPECT_TRUE(eventually([] { return g_calls.load() == int(kvt::remote::kMaxStuckLookups); }));
  EXPECT_EQ(resolve(&a, "stalled.example", 6379, in_ms(60000), stalled_lookup), KVT_ERR_IO);
  why = kvt::last_error();
  EXPECT_NE(why.find("still waiting for DNS"), std::string::npos) << why;
  EXPECT_EQ(g_calls.load(), int(kvt::remote::kMaxStuckLookups)) << "a lookup past the cap ran";

  set_gate(true);
  EXPECT_TRUE(eventually([] { return lookups_running() == 0; }));
  EXPECT_EQ(resolve(&a, "stalled.example", 6379, in_ms(60000), stalled_lookup), KVT_OK)
      << kvt::last_error();
  EXPECT_NE(a.get(), nullptr);
}
