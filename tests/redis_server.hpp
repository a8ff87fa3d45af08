// A real redis-server for tests: Debian's binary on 127.0.0.1 (a free port, and optionally a
// Unix socket) in a temporary directory, with no persistence. It can be killed with SIGKILL
// and restarted on the same port; it is stopped when the object goes. A test that cannot
// start it fails (redis-server is a dependency), never passes silently:
//
//   kvt_test::RedisServer redis;
//   ASSERT_TRUE(redis.start({.maxmemory = "8mb", .policy = "allkeys-lru"}));
//   redis.url();                       // "redis://127.0.0.1:PORT"
//   redis.command({"SET", key, "garbage"});   // a raw command, binary-safe (hiredis)
#pragma once

#include <gtest/gtest.h>
#include <hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char **environ;

namespace kvt_test {

struct RedisOptions {
  std::string maxmemory{};  // e.g. "8mb"; empty: no limit
  std::string policy{};     // maxmemory-policy, e.g. "allkeys-lru"; empty: Redis's default
  std::string password{};   // requirepass; empty: none
  bool unix_socket = false;
  bool cluster = false;     // cluster-enabled, a node timeout of 1 s (tests/redis_cluster.hpp)
};

struct ReplyDeleter {
  void operator()(redisReply *r) const { freeReplyObject(r); }
};
using RedisReply = std::unique_ptr<redisReply, ReplyDeleter>;

class RedisServer {
 public:
  RedisServer() = default;
  RedisServer(const RedisServer &) = delete;
  RedisServer &operator=(const RedisServer &) = delete;
  ~RedisServer() {
    stop();
    if (!dir_.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(dir_, ec);
    }
  }

  // Starts it on a free port and waits until it answers PING (5 s at most).
  ::testing::AssertionResult start(RedisOptions o = {}) {
    opt_ = std::move(o);
    binary_ = find_binary();
    if (binary_.empty())
      return ::testing::AssertionFailure()
             << "redis-server not found on PATH nor at /usr/bin/redis-server: install "
                "redis-server (tools/install-deps.sh)";
    if (dir_.empty()) {
      std::string t = "/tmp/kvtier-redis-XXXXXX";
      if (!mkdtemp(t.data())) return ::testing::AssertionFailure() << "mkdtemp failed";
      dir_ = t;
    }
    // A port another process takes between our probe and Redis's bind: try another.
    for (int attempt = 0; attempt < 5; ++attempt) {
      port_ = free_port(opt_.cluster);
      if (port_ == 0) return ::testing::AssertionFailure() << "no free port";
      auto r = launch();
      if (r) return r;
      if (attempt == 4) return r;
    }
    return ::testing::AssertionFailure();
  }

  // SIGKILL, and waits for it to be gone: clients see their connections reset.
  void kill9() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

  // Starts it again on the same port (and socket), empty.
  ::testing::AssertionResult restart() {
    kill9();
    // The port may linger a moment after the kill; launch() reports a real failure.
    ::testing::AssertionResult r = ::testing::AssertionFailure();
    for (int attempt = 0; attempt < 20; ++attempt) {
      r = launch();
      if (r) return r;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return r;
  }

  // SIGTERM (SIGKILL after 2 s), and waits.
  void stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    for (int i = 0; i < 200; ++i) {
      if (waitpid(pid_, nullptr, WNOHANG) == pid_) {
        pid_ = -1;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    kill9();
  }

  bool running() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }
  int port() const { return port_; }
  const std::string &dir() const { return dir_; }
  std::string socket_path() const { return dir_ + "/redis.sock"; }
  std::string url() const { return "redis://127.0.0.1:" + std::to_string(port_); }
  std::string unix_url() const { return "unix://" + socket_path(); }
  // The server's log, for a failure message.
  std::string log() const {
    std::ifstream f(dir_ + "/redis.log");
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }

  // Runs one command on a connection of its own (AUTH first when there is a password);
  // nullptr when the server cannot be reached. Arguments are binary-safe.
  RedisReply command(const std::vector<std::string> &argv) const {
    timeval tv{2, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", port_, tv);
    if (c == nullptr) return nullptr;
    std::unique_ptr<redisContext, void (*)(redisContext *)> ctx(c, redisFree);
    if (c->err) return nullptr;
    redisSetTimeout(c, tv);
    if (!opt_.password.empty()) {
      RedisReply a(static_cast<redisReply *>(redisCommand(c, "AUTH %b", opt_.password.data(),
                                                          opt_.password.size())));
      if (!a || a->type == REDIS_REPLY_ERROR) return nullptr;
    }
    std::vector<const char *> args;
    std::vector<size_t> lens;
    for (auto &s : argv) {
      args.push_back(s.data());
      lens.push_back(s.size());
    }
    return RedisReply(static_cast<redisReply *>(
        redisCommandArgv(c, int(args.size()), args.data(), lens.data())));
  }

  // An integer reply (e.g. DBSIZE, EXISTS), -1 on anything else.
  long long integer(const std::vector<std::string> &argv) const {
    RedisReply r = command(argv);
    return r && r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
  }

 private:
  static std::string find_binary() {
    if (const char *path = std::getenv("PATH")) {
      std::stringstream ss(path);
      for (std::string d; std::getline(ss, d, ':');) {
        std::string p = d + "/redis-server";
        if (!d.empty() && access(p.c_str(), X_OK) == 0) return p;
      }
    }
    return access("/usr/bin/redis-server", X_OK) == 0 ? "/usr/bin/redis-server" : "";
  }

  // A cluster node also listens on its port + 10000 (the cluster bus): Redis refuses ports
  // over 55535 there, so a node's port is drawn until it is low enough.
  static int free_port(bool cluster) {
    for (int tries = 0; tries < 1000; ++tries)
      if (int p = free_port(); p != 0 && (!cluster || (p <= 55535 && bus_free(p + 10000))))
        return p;
    return 0;
  }
  static bool bus_free(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(uint16_t(port));
    const bool ok = fd >= 0 && bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) == 0;
    if (fd >= 0) close(fd);
    return ok;
  }

  static int free_port() {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return 0;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    int port = 0;
    if (bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr *>(&a), &len) == 0)
      port = ntohs(a.sin_port);
    close(fd);
    return port;
  }

  ::testing::AssertionResult launch() {
    std::vector<std::string> a = {binary_,      "--port",       std::to_string(port_),
                                  "--bind",     "127.0.0.1",    "--dir",
                                  dir_,         "--save",       "",
                                  "--appendonly", "no",         "--daemonize",
                                  "no",         "--logfile",    dir_ + "/redis.log"};
    if (opt_.unix_socket)
      a.insert(a.end(), {"--unixsocket", socket_path(), "--unixsocketperm", "700"});
    if (!opt_.maxmemory.empty()) a.insert(a.end(), {"--maxmemory", opt_.maxmemory});
    if (!opt_.policy.empty()) a.insert(a.end(), {"--maxmemory-policy", opt_.policy});
    if (!opt_.password.empty()) a.insert(a.end(), {"--requirepass", opt_.password});
    if (opt_.cluster)
      a.insert(a.end(), {"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                         "--cluster-node-timeout", "1000"});
    std::vector<char *> argv;
    for (auto &s : a) argv.push_back(s.data());
    argv.push_back(nullptr);
    pid_t pid = -1;
    if (posix_spawn(&pid, binary_.c_str(), nullptr, nullptr, argv.data(), environ) != 0)
      return ::testing::AssertionFailure() << "cannot spawn " << binary_;
    pid_ = pid;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (std::chrono::steady_clock::now() < deadline) {
      int st = 0;
      if (waitpid(pid_, &st, WNOHANG) == pid_) {
        pid_ = -1;
        return ::testing::AssertionFailure()
               << "redis-server exited at start on port " << port_ << ":\n" << log();
      }
      RedisReply r = command({"PING"});
      if (r && r->type == REDIS_REPLY_STATUS && std::string(r->str, r->len) == "PONG")
        return ::testing::AssertionSuccess();
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    kill9();
    return ::testing::AssertionFailure() << "redis-server did not answer PING in 5 s:\n"
                                         << log();
  }

  RedisOptions opt_;
  std::string binary_, dir_;
  int port_ = 0;
  pid_t pid_ = -1;
};

}  // namespace kvt_test
