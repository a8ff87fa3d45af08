// The management endpoint's timeline record, driven on the library's own Bus and Endpoint: it
// runs while a client is connected and for a linger after the last one left, and only then.
#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "endpoint_client.hpp"
#include "observe/bus.hpp"
#include "observe/endpoint.hpp"
#include "support.hpp"

using kvt_test::TempDir;

namespace {

// The record goes on for history_linger_ns after the last client left, so that a console
// that reconnects finds it whole (the same recorded_since_ns), then stops whole, and the
// stream is off again.
TEST(EndpointHistory, StopsALingerAfterTheLastClientLeft) {
  TempDir dir;
  const auto since = [](const std::string &reply) {
    const std::string key = "\"recorded_since_ns\":";
    const size_t at = reply.find(key);
    EXPECT_NE(at, std::string::npos) << reply;
    return at == std::string::npos ? 0 : std::stoull(reply.substr(at + key.size()));
  };
  for (const uint64_t linger : {uint64_t{0}, uint64_t{600'000'000'000}}) {
    SCOPED_TRACE(linger);
    auto bus = std::make_shared<kvt::obs::Bus>();
    kvt::obs::Endpoint e;
    kvt::obs::EndpointLimits limits;
    limits.history_linger_ns = linger;
    const std::string sock = dir.path + "/l" + std::to_string(linger) + ".sock";
    ASSERT_KVT_OK(e.open(sock, bus, {}, limits));
    EXPECT_FALSE(bus->on());
    const std::string ask = "{\"cmd\": \"timeline\", \"req_id\": \"x\"}\n";
    const uint64_t first = since(ask_endpoint(sock, ask));
    if (linger == 0) {
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      while (bus->on()) {
        ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "the record never stopped";
        std::this_thread::yield();
      }
      EXPECT_GT(since(ask_endpoint(sock, ask)), first) << "a new record";
    } else {
      EXPECT_EQ(since(ask_endpoint(sock, ask)), first) << "the record stopped as the client left";
      EXPECT_TRUE(bus->on());
    }
  }
}

}  // namespace
