// The management endpoint against hostile and careless local clients (issue 24, findings 4,
// 5 and 8): the socket's mode and the peers' uids, a stale socket replaced and a live one
// never, a limit on clients and on descriptors, a byte budget per client.
#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "connector_support.hpp"
#include "support.hpp"

using namespace kvt_test;

namespace {

using Clock = std::chrono::steady_clock;

sockaddr_un address(const std::string &path) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::snprintf(a.sun_path, sizeof a.sun_path, "%s", path.c_str());
  return a;
}

// A connected client, or -1 with errno set.
int dial(const std::string &path, bool nonblocking = false) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | (nonblocking ? SOCK_NONBLOCK : 0), 0);
  sockaddr_un a = address(path);
  if (connect(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) != 0) {
    const int err = errno;
    close(fd);
    errno = err;
    return -1;
  }
  return fd;
}

// Everything the endpoint sends on fd until it closes, or until deadline.
std::string read_to_eof(int fd, std::chrono::seconds deadline = std::chrono::seconds(30)) {
  std::string got;
  const auto end = Clock::now() + deadline;
  char b[4096];
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 100) < 0 || Clock::now() > end) return got + "<no EOF>";
    if (!(p.revents & (POLLIN | POLLHUP))) continue;
    ssize_t n = read(fd, b, sizeof b);
    if (n <= 0) return got;
    got.append(b, size_t(n));
  }
}

struct Endpoint {
  kvt_endpoint *e = nullptr;
  ~Endpoint() { kvt_endpoint_close(e); }
  kvt_endpoint_stats stats() const {
    kvt_endpoint_stats s{};
    s.struct_size = sizeof s;
    EXPECT_EQ(kvt_endpoint_stats_get(&s, e), KVT_OK) << kvt_last_error();
    return s;
  }
};

kvt_endpoint_config config() {
  kvt_endpoint_config c;
  kvt_endpoint_config_init(&c);
  return c;
}

size_t count_lines(const std::string &s, const std::string &with = "") {
  size_t n = 0;
  for (size_t at = 0, nl; (nl = s.find('\n', at)) != std::string::npos; at = nl + 1)
    n += with.empty() || s.substr(at, nl - at).find(with) != std::string::npos;
  return n;
}

size_t open_descriptors() {
  size_t n = 0;
  DIR *d = opendir("/proc/self/fd");
  while (dirent *e = readdir(d)) n += e->d_name[0] != '.';
  closedir(d);
  return n - 1;  // opendir's own
}

}  // namespace

// Finding 5: the socket was created with the umask's mode (0777 under umask 000, where any
// local user could pause the engine). Now 0600 whatever the umask; 0660 with its group for
// allow_gid, 0666 for allow_uid (the uid check then keeps others out).
TEST(Endpoint, SocketModeIgnoresTheUmask) {
  TempDir dir;
  auto m = make(small_config());
  const mode_t old = umask(0);
  struct stat st;
  {
    Endpoint ep;
    ASSERT_KVT_OK(kvt_endpoint_open(&ep.e, m.get(), nullptr, (dir.path + "/a.sock").c_str()));
    ASSERT_EQ(lstat((dir.path + "/a.sock").c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 07777, 0600u);
    EXPECT_TRUE(S_ISSOCK(st.st_mode));
  }
  kvt_endpoint_config c = config();
  c.allow_gid = getegid();
  {
    Endpoint ep;
    ASSERT_KVT_OK(kvt_endpoint_open_with(&ep.e, m.get(), nullptr, (dir.path + "/b.sock").c_str(), &c));
    ASSERT_EQ(lstat((dir.path + "/b.sock").c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 07777, 0660u);
    EXPECT_EQ(st.st_gid, getegid());
  }
  c.allow_uid = 65533;
  {
    Endpoint ep;
    ASSERT_KVT_OK(kvt_endpoint_open_with(&ep.e, m.get(), nullptr, (dir.path + "/c.sock").c_str(), &c));
    ASSERT_EQ(lstat((dir.path + "/c.sock").c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 07777, 0666u);
  }
  umask(old);
  EXPECT_EQ(TempDir::names_of(dir.path).size(), 0u) << "close removes the socket and its lock";
}

// Finding 5: after kill -9 the socket file (and now its lock file) stay, and the restarted
// host failed with "Address already in use". What a killed owner leaves, a socket nobody
// listens on and a lock file nobody holds, is replaced; a live owner's socket never is.
TEST(Endpoint, AStaleSocketIsReplacedAndALiveOneNever) {
  TempDir dir;
  auto m = make(small_config());
  const std::string path = dir.path + "/k.sock";
  {  // what kill -9 leaves
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un a = address(path);
    ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof a), 0);
    ASSERT_EQ(listen(fd, 4), 0);
    close(fd);
    spit(path + ".lock", "");
  }
  Endpoint live;
  ASSERT_KVT_OK(kvt_endpoint_open(&live.e, m.get(), nullptr, path.c_str()));
  int fd = dial(path);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(write(fd, "{\"cmd\":\"tiers\"}\n", 16), 16);
  shutdown(fd, SHUT_WR);
  EXPECT_NE(read_to_eof(fd).find("\"ok\":true"), std::string::npos);
  close(fd);

  Endpoint second;  // a live owner holds it: refused, and the first goes on serving
  EXPECT_KVT(kvt_endpoint_open(&second.e, m.get(), nullptr, path.c_str()), KVT_ERR_STATE);
  EXPECT_NE(std::string(kvt_last_error()).find("served by a live process"), std::string::npos)
      << kvt_last_error();
  fd = dial(path);
  ASSERT_GE(fd, 0) << "the refused open took the live one's socket";
  close(fd);

  // A socket served by a process that holds no lock (another program): never removed.
  const std::string other = dir.path + "/other.sock";
  int lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un a = address(other);
  ASSERT_EQ(bind(lfd, reinterpret_cast<sockaddr *>(&a), sizeof a), 0);
  ASSERT_EQ(listen(lfd, 4), 0);
  EXPECT_KVT(kvt_endpoint_open(&second.e, m.get(), nullptr, other.c_str()), KVT_ERR_STATE);
  EXPECT_NE(std::string(kvt_last_error()).find("holds no lock"), std::string::npos);
  fd = dial(other);
  EXPECT_GE(fd, 0);
  close(fd);
  close(lfd);

  // A regular file, or a symlink to one: not a socket, left as it was.
  const std::string file = dir.path + "/file", alias = dir.path + "/link.sock";
  spit(file, "precious");
  ASSERT_EQ(symlink(file.c_str(), alias.c_str()), 0);
  EXPECT_KVT(kvt_endpoint_open(&second.e, m.get(), nullptr, file.c_str()),
             KVT_ERR_INVALID_ARGUMENT);
  EXPECT_KVT(kvt_endpoint_open(&second.e, m.get(), nullptr, alias.c_str()),
             KVT_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kvt_last_error()).find("is not a socket"), std::string::npos);
  EXPECT_EQ(slurp(file), "precious");
  EXPECT_EQ(TempDir::names_of(dir.path),
            (std::vector<std::string>{"file", "k.sock", "k.sock.lock", "link.sock",
                                      "other.sock"}))
      << "a refused open leaves no lock file behind";
}

namespace {

// In a child that becomes uid:gid, one request to path: what came back, or "connect: ERRNO".
// Only system calls after fork: the parent has threads. The child ends by SIGKILL, so that
// valgrind, which follows a fork, does not check the parent's heap for leaks at its exit.
std::string ask_as(const std::string &path, uid_t uid, gid_t gid) {
  int pipefd[2];
  if (pipe(pipefd) != 0) return "pipe";
  sockaddr_un a = address(path);
  pid_t pid = fork();
  if (pid == 0) {
    close(pipefd[0]);
    char out[4096];
    int len = 0;
    if (setgroups(0, nullptr) != 0 || setgid(gid) != 0 || setuid(uid) != 0) raise(SIGSEGV);
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    if (connect(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) != 0) {
      len = std::snprintf(out, sizeof out, "connect: %d", errno);
    } else {
      static const char req[] = "{\"cmd\":\"tiers\"}\n";
      // It may have been turned away already: no SIGPIPE, and its line is still to read.
      [[maybe_unused]] ssize_t n = send(fd, req, sizeof req - 1, MSG_NOSIGNAL);
      shutdown(fd, SHUT_WR);
      for (ssize_t n; len < int(sizeof out) && (n = read(fd, out + len, sizeof out - len)) > 0;)
        len += int(n);
    }
    if (write(pipefd[1], out, size_t(len)) != len) raise(SIGSEGV);
    raise(SIGKILL);
  }
  close(pipefd[1]);
  const std::string got = read_to_eof(pipefd[0]);
  close(pipefd[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL ? got : "child failed";
}

}  // namespace

// Finding 5: nothing checked the peer. Now its uid (SO_PEERCRED): the process's own user and
// root, plus allow_uid, plus allow_gid's members. Needs root, to be another user.
TEST(Endpoint, PeersAreCheckedByUid) {
  if (geteuid() != 0) GTEST_SKIP() << "SKIPPED: needs root to connect as another user";
  TempDir dir;
  ASSERT_EQ(chmod(dir.path.c_str(), 0711), 0);
  auto m = make(small_config());
  const uid_t nobody = 65534;
  const gid_t nogroup = 65534;
  auto serve = [&](const std::string &name, int64_t uid, int64_t gid, Endpoint *ep) {
    kvt_endpoint_config c = config();
    c.allow_uid = uid;
    c.allow_gid = gid;
    const std::string path = dir.path + "/" + name;
    EXPECT_EQ(kvt_endpoint_open_with(&ep->e, m.get(), nullptr, path.c_str(), &c), KVT_OK)
        << kvt_last_error();
    return path;
  };
  Endpoint mine, other_uid, nobody_ok, group_ok;
  // The default: mode 0600 keeps another user out before the endpoint sees it.
  EXPECT_EQ(ask_as(serve("mine", -1, -1, &mine), nobody, nogroup),
            "connect: " + std::to_string(EACCES));
  // Mode 0666 for uid 65533: nobody reaches the socket, and the endpoint turns it away.
  const std::string r = ask_as(serve("other", 65533, -1, &other_uid), nobody, nogroup);
  EXPECT_NE(r.find("\"ok\":false"), std::string::npos) << r;
  EXPECT_NE(r.find("uid 65534 (gid 65534) may not use this endpoint"), std::string::npos) << r;
  EXPECT_EQ(count_lines(r), 1u);
  EXPECT_EQ(other_uid.stats().refused, 1u);
  EXPECT_NE(ask_as(serve("nobody", nobody, -1, &nobody_ok), nobody, nogroup).find("\"ok\":true"),
            std::string::npos);
  EXPECT_NE(ask_as(serve("group", -1, nogroup, &group_ok), nobody, nogroup).find("\"ok\":true"),
            std::string::npos);
  EXPECT_EQ(group_ok.stats().refused, 0u);
}

// Finding 4: the endpoint accepted every client. 266 idle clients against a 256-descriptor
// limit took the host's descriptors (its own kvt_subscription_create failed with EMFILE) and left
// the endpoint spinning on a failing accept. Now clients beyond max_clients get one line and are
// closed, and an accept that runs out of descriptors rests instead of spinning.
TEST(Endpoint, ClientsBeyondTheLimitAreTurnedAwayAndTheHostKeepsItsDescriptors) {
  TempDir dir;
  auto m = make(small_config());
  const std::string path = dir.path + "/k.sock";
  kvt_endpoint_config c = config();
  c.max_clients = 4;
  Endpoint ep;
  ASSERT_KVT_OK(kvt_endpoint_open_with(&ep.e, m.get(), nullptr, path.c_str(), &c));

  constexpr int kClients = 40;
  std::vector<int> fds(kClients);
  for (int &fd : fds) fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  rlimit old{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &old), 0);
  rlimit tight = old;
  tight.rlim_cur = open_descriptors() + 12;  // room for 4 clients, the host, and no more
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &tight), 0);
  sockaddr_un a = address(path);
  std::vector<std::string> got(kClients);
  std::vector<bool> connected(kClients), done(kClients);
  int finished = 0;
  const auto end = Clock::now() + std::chrono::seconds(30);
  while (finished < kClients && Clock::now() < end) {
    for (int i = 0; i < kClients; ++i) {
      if (done[i]) continue;
      if (!connected[i]) {
        if (connect(fds[i], reinterpret_cast<sockaddr *>(&a), sizeof a) != 0) continue;
        connected[i] = true;
        // It may have been turned away and closed already: no SIGPIPE, and its line is
        // still to read.
        [[maybe_unused]] ssize_t n = send(fds[i], "{\"cmd\":\"tiers\"}\n", 16, MSG_NOSIGNAL);
      }
      char b[512];
      ssize_t n = read(fds[i], b, sizeof b);
      if (n > 0) got[i].append(b, size_t(n));
      // Served clients stay connected: one reply is theirs. Turned-away ones are closed.
      if (n == 0 || got[i].find("\"ok\":true") != std::string::npos) done[i] = true, ++finished;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  kvt_subscription *sub = nullptr;
  const kvt_status sub_st = kvt_subscription_create(&sub, m.get(), 16);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &old), 0);
  EXPECT_EQ(sub_st, KVT_OK) << "the endpoint took the host's descriptors: " << kvt_last_error();
  kvt_subscription_destroy(sub);
  ASSERT_EQ(finished, kClients) << "some clients were neither served nor turned away";
  size_t served = 0, away = 0;
  for (const std::string &g : got) {
    served += g.find("\"ok\":true") != std::string::npos;
    away += g.find("too many clients (4)") != std::string::npos;
  }
  EXPECT_EQ(served, 4u);
  EXPECT_EQ(away, size_t(kClients - 4));
  EXPECT_EQ(ep.stats().refused, uint64_t(kClients - 4));
  EXPECT_EQ(ep.stats().clients, 4u);
  for (int fd : fds) close(fd);
}

namespace {

// CPU seconds the thread named name has used, from /proc; -1 if there is none.
double thread_cpu_seconds(const std::string &name) {
  DIR *d = opendir("/proc/self/task");
  double secs = -1;
  while (dirent *e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    const std::string task = std::string("/proc/self/task/") + e->d_name;
    std::string comm = slurp(task + "/comm");
    if (comm != name + "\n") continue;
    const std::string stat = slurp(task + "/stat");
    // After "(comm) ": state, then fields 4..; utime and stime are fields 14 and 15.
    std::istringstream in(stat.substr(stat.rfind(')') + 2));
    std::string field;
    unsigned long long utime = 0, stime = 0;
    for (int i = 3; i <= 15 && in >> field; ++i) {
      if (i == 14) utime = std::stoull(field);
      if (i == 15) stime = std::stoull(field);
    }
    secs = double(utime + stime) / double(sysconf(_SC_CLK_TCK));
  }
  closedir(d);
  return secs;
}

}  // namespace

// Finding 4, the spin: with no descriptor left, accept fails at once and poll reports the
// waiting client again. The endpoint now rests 200 ms between tries: over a second of no
// descriptors it uses a small part of a core, and serves the client once there are some.
TEST(Endpoint, AnAcceptWithoutDescriptorsRestsAndServesLater) {
  TempDir dir;
  auto m = make(small_config());
  const std::string path = dir.path + "/k.sock";
  Endpoint ep;
  ASSERT_KVT_OK(kvt_endpoint_open(&ep.e, m.get(), nullptr, path.c_str()));
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  rlimit old{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &old), 0);
  rlimit none = old;
  none.rlim_cur = open_descriptors();
  double before = -1;  // the thread names itself once it runs
  for (const auto end = Clock::now() + std::chrono::seconds(30); before < 0 && Clock::now() < end;
       std::this_thread::sleep_for(std::chrono::milliseconds(5)))
    before = thread_cpu_seconds("kvt-endpoint");
  ASSERT_GE(before, 0) << "no thread named kvt-endpoint";
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &none), 0);
  sockaddr_un a = address(path);
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr *>(&a), sizeof a), 0);
  const auto t0 = Clock::now();
  std::this_thread::sleep_for(std::chrono::seconds(1));
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &old), 0);
  const double used = thread_cpu_seconds("kvt-endpoint") - before;  // a few ms late: fine
  EXPECT_LT(used, 0.25 * wall) << "the endpoint spun on a failing accept";
  ASSERT_EQ(write(fd, "{\"cmd\":\"tiers\"}\n", 16), 16);
  shutdown(fd, SHUT_WR);
  EXPECT_NE(read_to_eof(fd).find("\"ok\":true"), std::string::npos);
  close(fd);
}

// Finding 8: pipelined requests from a client that never read pushed the host from 8 to 95
// MiB before a drop rule applied. Now its replies wait up to client_buffer_bytes, then its
// requests wait unread in its socket; once it reads, every request is answered, none lost.
TEST(Endpoint, PipelinedRequestsOfAClientThatDoesNotReadStayWithinItsBudget) {
  TempDir dir;
  auto m = make(small_config());
  const std::string path = dir.path + "/k.sock";
  kvt_endpoint_config c = config();
  c.client_buffer_bytes = 64 << 10;
  Endpoint ep;
  ASSERT_KVT_OK(kvt_endpoint_open_with(&ep.e, m.get(), nullptr, path.c_str(), &c));
  int fd = dial(path, true);
  ASSERT_GE(fd, 0);
  std::string batch;
  for (int i = 0; i < 200; ++i) batch += "{\"cmd\":\"metrics\"}\n";
  size_t sent = 0;  // requests
  const auto end = Clock::now() + std::chrono::seconds(60);
  // Write until the socket is full and the endpoint has filled the client's budget.
  for (size_t off = 0; Clock::now() < end;) {
    ssize_t n = send(fd, batch.data() + off, batch.size() - off, MSG_NOSIGNAL);
    if (n > 0) {
      off += size_t(n);
      if (off == batch.size()) off = 0, sent += 200;
      continue;
    }
    ASSERT_EQ(errno, EAGAIN) << "the endpoint dropped the client: " << std::strerror(errno);
    if (ep.stats().peak_buffered_bytes >= c.client_buffer_bytes) {
      // Finish the request cut in two, so that every request sent is whole.
      while (off != 0 && off < batch.size()) {
        pollfd p{fd, POLLOUT, 0};
        if (poll(&p, 1, 100) == 1 && (n = send(fd, batch.data() + off, batch.size() - off,
                                               MSG_NOSIGNAL)) > 0)
          off += size_t(n);
        else if (Clock::now() > end)
          break;
      }
      sent += off / 18;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const kvt_endpoint_stats s = ep.stats();
  ASSERT_GE(s.peak_buffered_bytes, c.client_buffer_bytes) << "the budget was never reached";
  size_t len = 0;
  kvt_metrics_text(nullptr, 0, &len, m.get(), nullptr);
  EXPECT_LE(s.peak_buffered_bytes, c.client_buffer_bytes + 2 * len + 1024)
      << "more than the budget and one reply";
  EXPECT_GT(sent * len, size_t{8} << 20) << "the test asked for less than the old drop rule";
  shutdown(fd, SHUT_WR);
  const std::string replies = read_to_eof(fd, std::chrono::seconds(120));
  EXPECT_EQ(count_lines(replies, "\"ok\":true"), sent);
  EXPECT_EQ(count_lines(replies), sent);
  close(fd);
  EXPECT_EQ(ep.stats().dropped, 0u);
}

// A client that sends its requests and shuts its side (printf ... | nc -U) gets every reply
// before the endpoint closes; it used to get none.
TEST(Endpoint, AClientThatHalfClosesGetsEveryReply) {
  TempDir dir;
  auto m = make(small_config());
  const std::string path = dir.path + "/k.sock";
  Endpoint ep;
  ASSERT_KVT_OK(kvt_endpoint_open(&ep.e, m.get(), nullptr, path.c_str()));
  int fd = dial(path);
  ASSERT_GE(fd, 0);
  const std::string reqs = "{\"cmd\":\"tiers\"}\n{\"cmd\":\"nope\"}\n{\"cmd\":\"metrics\"}\n";
  ASSERT_EQ(write(fd, reqs.data(), reqs.size()), ssize_t(reqs.size()));
  shutdown(fd, SHUT_WR);
  const std::string r = read_to_eof(fd);
  EXPECT_EQ(count_lines(r), 3u) << r;
  EXPECT_EQ(count_lines(r, "\"ok\":true"), 2u) << r;
  EXPECT_NE(r.find("unknown cmd 'nope'"), std::string::npos);
  close(fd);

  // A line over 64 KiB: one error line, then closed.
  fd = dial(path);
  std::thread writer([&] {
    std::string big(100 << 10, 'x');
    [[maybe_unused]] ssize_t n = send(fd, big.data(), big.size(), MSG_NOSIGNAL);
  });
  const std::string r2 = read_to_eof(fd);
  writer.join();
  EXPECT_NE(r2.find("request longer than 64 KiB"), std::string::npos) << r2;
  EXPECT_EQ(count_lines(r2), 1u);
  close(fd);
  EXPECT_EQ(ep.stats().dropped, 1u);
}

TEST(Endpoint, BadConfigsAndArgumentsGetAStatusAndAMessage) {
  TempDir dir;
  auto m = make(small_config());
  const std::string path = dir.path + "/k.sock";
  kvt_endpoint *e = nullptr;
  kvt_endpoint_config c = config();
  EXPECT_EQ(c.max_clients, 64u);
  EXPECT_EQ(c.allow_uid, -1);
  EXPECT_EQ(c.allow_gid, -1);
  EXPECT_EQ(c.client_buffer_bytes, uint64_t{256} << 10);
  c.max_clients = 0;
  EXPECT_KVT(kvt_endpoint_open_with(&e, m.get(), nullptr, path.c_str(), &c),
             KVT_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kvt_last_error()).find("max_clients"), std::string::npos);
  c = config();
  c.client_buffer_bytes = 100;
  EXPECT_KVT(kvt_endpoint_open_with(&e, m.get(), nullptr, path.c_str(), &c),
             KVT_ERR_INVALID_ARGUMENT);
  c = config();
  c.allow_uid = -2;
  EXPECT_KVT(kvt_endpoint_open_with(&e, m.get(), nullptr, path.c_str(), &c),
             KVT_ERR_INVALID_ARGUMENT);
  c = config();
  c.struct_size = 12;
  EXPECT_KVT(kvt_endpoint_open_with(&e, m.get(), nullptr, path.c_str(), &c),
             KVT_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kvt_last_error()).find("kvt_endpoint_config"), std::string::npos);
  EXPECT_EQ(e, nullptr);
  kvt_endpoint_stats s{};
  s.struct_size = sizeof s;
  EXPECT_KVT(kvt_endpoint_stats_get(&s, nullptr), KVT_ERR_INVALID_HANDLE);
  ASSERT_KVT_OK(kvt_endpoint_open_with(&e, m.get(), nullptr, path.c_str(), nullptr));
  s.struct_size = 8;
  EXPECT_KVT(kvt_endpoint_stats_get(&s, e), KVT_ERR_INVALID_ARGUMENT);
  EXPECT_KVT(kvt_endpoint_stats_get(nullptr, e), KVT_ERR_INVALID_ARGUMENT);
  kvt_endpoint_close(e);
  EXPECT_TRUE(TempDir::names_of(dir.path).empty());
}
