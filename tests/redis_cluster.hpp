// A real Redis Cluster for tests: Debian's redis-server nodes on 127.0.0.1 (free ports, one
// temporary directory each, tests/redis_server.hpp), joined by `redis-cli --cluster create`.
// Nodes can be killed; slots can be moved with `redis-cli --cluster reshard` while a test
// runs. Every wait has a deadline, and a cluster that does not form fails the test:
//
//   kvt_test::RedisCluster cluster;
//   ASSERT_TRUE(cluster.start(3, 1));  // 3 masters, a replica each
//   cluster.url();                     // "redis+cluster://127.0.0.1:P1,127.0.0.1:P2,..."
#pragma once

#include <fcntl.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "redis_server.hpp"

namespace kvt_test {

class RedisCluster {
 public:
  ::testing::AssertionResult start(int masters, int replicas_per_master) {
    const int n = masters * (1 + replicas_per_master);
    for (int i = 0; i < n; ++i) {
      nodes_.push_back(std::make_unique<RedisServer>());
      if (auto r = nodes_.back()->start({.cluster = true}); !r) return r;
    }
    std::vector<std::string> args = {"--cluster", "create"};
    for (auto &s : nodes_) args.push_back(address(*s));
    args.insert(args.end(), {"--cluster-replicas", std::to_string(replicas_per_master),
                             "--cluster-yes"});
    std::string out;
    if (int rc = cli(args, &out); rc != 0)
      return ::testing::AssertionFailure() << "redis-cli --cluster create exited " << rc
                                           << ":\n" << out;
    return wait_ok();
  }

  size_t size() const { return nodes_.size(); }
  RedisServer &node(size_t i) { return *nodes_[i]; }
  static std::string address(const RedisServer &s) {
    return "127.0.0.1:" + std::to_string(s.port());
  }
  // Every node as a seed.
  std::string url() const {
    std::string u = "redis+cluster://";
    for (size_t i = 0; i < nodes_.size(); ++i) u += (i ? "," : "") + address(*nodes_[i]);
    return u;
  }

  std::string id(size_t i) const { return text(i, {"CLUSTER", "MYID"}); }
  bool is_master(size_t i) const {
    RedisReply r = nodes_[i]->command({"ROLE"});
    return r && r->type == REDIS_REPLY_ARRAY && r->elements > 0 &&
           std::string(r->element[0]->str, r->element[0]->len) == "master";
  }
  // The node a replica follows, or -1.
  int master_of(size_t replica) const {
    RedisReply r = nodes_[replica]->command({"ROLE"});
    if (!r || r->type != REDIS_REPLY_ARRAY || r->elements < 3 ||
        r->element[2]->type != REDIS_REPLY_INTEGER)
      return -1;
    for (size_t i = 0; i < nodes_.size(); ++i)
      if (nodes_[i]->running() && nodes_[i]->port() == r->element[2]->integer) return int(i);
    return -1;
  }
  // Whether a replica has every write its master has acknowledged.
  bool caught_up(size_t replica) const {
    const int m = master_of(replica);
    if (m < 0) return false;
    const long long a = info_number(size_t(m), "master_repl_offset");
    const long long b = info_number(replica, "slave_repl_offset");
    return a > 0 && a == b;
  }

  // Until every running node says cluster_state:ok and serves all 16384 slots.
  ::testing::AssertionResult wait_ok(std::chrono::seconds limit = std::chrono::seconds(60)) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    std::string last;
    while (std::chrono::steady_clock::now() < deadline) {
      bool ok = true;
      for (size_t i = 0; ok && i < nodes_.size(); ++i) {
        if (!nodes_[i]->running()) continue;
        last = text(i, {"CLUSTER", "INFO"});
        ok = last.find("cluster_state:ok") != std::string::npos &&
             last.find("cluster_slots_ok:16384") != std::string::npos;
      }
      if (ok) return ::testing::AssertionSuccess();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return ::testing::AssertionFailure() << "the cluster did not settle in " << limit.count()
                                         << " s; CLUSTER INFO:\n" << last;
  }

  // Runs redis-cli with args and waits; its exit status, its output in *out.
  int cli(const std::vector<std::string> &args, std::string *out = nullptr) const {
    const std::string log = nodes_[0]->dir() + "/redis-cli.log";
    pid_t pid = cli_async(args, log);
    if (pid < 0) return -1;
    int st = 0;
    waitpid(pid, &st, 0);
    if (out) *out = read_file(log);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  }
  // Starts `redis-cli --cluster reshard` of `slots` slots from master `from` to master `to`,
  // its output to <node 0's dir>/reshard.log (reshard_log()); its pid.
  pid_t reshard_async(size_t from, size_t to, int slots) const {
    return cli_async({"--cluster", "reshard", address(*nodes_[from]), "--cluster-from", id(from),
                      "--cluster-to", id(to), "--cluster-slots", std::to_string(slots),
                      "--cluster-yes"},
                     reshard_log());
  }
  std::string reshard_log() const { return nodes_[0]->dir() + "/reshard.log"; }

  // Starts redis-cli with args, its output to log; its pid (-1 when it cannot start).
  pid_t cli_async(const std::vector<std::string> &args, const std::string &log) const {
    std::vector<std::string> a = {"redis-cli"};
    a.insert(a.end(), args.begin(), args.end());
    std::vector<char *> argv;
    for (auto &s : a) argv.push_back(const_cast<char *>(s.c_str()));
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, log.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_adddup2(&fa, STDOUT_FILENO, STDERR_FILENO);
    posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
    pid_t pid = -1;
    if (posix_spawnp(&pid, "redis-cli", &fa, nullptr, argv.data(), environ) != 0) pid = -1;
    posix_spawn_file_actions_destroy(&fa);
    return pid;
  }

  static std::string read_file(const std::string &path) {
    std::ifstream f(path);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }

 private:
  std::string text(size_t i, const std::vector<std::string> &argv) const {
    RedisReply r = nodes_[i]->command(argv);
    return r && (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS)
               ? std::string(r->str, r->len)
               : std::string();
  }
  long long info_number(size_t i, const std::string &field) const {
    const std::string info = text(i, {"INFO", "replication"});
    const size_t at = info.find(field + ":");
    return at == std::string::npos ? -1 : std::atoll(info.c_str() + at + field.size() + 1);
  }

  std::vector<std::unique_ptr<RedisServer>> nodes_;
};

}  // namespace kvt_test
