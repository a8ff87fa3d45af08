// G4's client (src/remote) against a real redis-server (tests/redis_server.hpp).
#include <gtest/gtest.h>

#include "redis_server.hpp"

namespace {

using kvt_test::RedisServer;

// The fixture itself: a value survives until the kill, the restart is empty and answers
// on the same port.
TEST(G4Redis, FixtureKillRestart) {
  RedisServer redis;
  ASSERT_TRUE(redis.start({.unix_socket = true}));
  auto r = redis.command({"SET", "k", std::string("a\0b", 3)});
  ASSERT_TRUE(r);
  EXPECT_EQ(redis.integer({"EXISTS", "k"}), 1);
  EXPECT_TRUE(std::filesystem::exists(redis.socket_path()));
  int port = redis.port();
  redis.kill9();
  EXPECT_EQ(redis.command({"PING"}), nullptr);
  ASSERT_TRUE(redis.restart());
  EXPECT_EQ(redis.port(), port);
  EXPECT_EQ(redis.integer({"EXISTS", "k"}), 0);
}

}  // namespace
