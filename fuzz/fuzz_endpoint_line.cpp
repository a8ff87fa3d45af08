// fuzz_endpoint_line: the management endpoint (src/observe/endpoint.cpp) served by the real
// library on a Unix socket, fed the input as request lines, as any local client may send
// them. Every line must get exactly one reply line that is JSON with a boolean "ok" (event
// lines of a subscription aside), in order, before the endpoint closes the connection; a
// last {"cmd":"clear"} must still be answered "ok": true. A crash, a hang (no reply within
// 20 s) or a reply that is not JSON aborts.
#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>

#include <nlohmann/json.hpp>

#include "kvtier.h"

namespace {

void check(bool ok, const char *what, const std::string &detail = "") {
  if (ok) return;
  std::fprintf(stderr, "fuzz_endpoint_line: %s %s\n", what, detail.c_str());
  std::abort();
}

struct Served {
  kvt_manager *m = nullptr;
  kvt_connector *c = nullptr;
  kvt_endpoint *e = nullptr;
  std::string dir, path;

  Served() {
    char t[] = "/tmp/kvtier-fuzz-endpoint-XXXXXX";
    dir = mkdtemp(t);
    path = dir + "/k.sock";
    kvt_manager_config mc;
    kvt_manager_config_init(&mc);
    mc.page_size = 4;
    mc.num_layers = 1;
    mc.num_outer = 2;
    mc.chunk_bytes = 64;
    mc.g1_blocks = 16;
    mc.g2_blocks = 16;
    mc.g1_memory = KVT_MEMORY_HOST;
    check(kvt_manager_create(&m, &mc) == KVT_OK, "manager", kvt_last_error());
    kvt_connector_config cc;
    kvt_connector_config_init(&cc);
    cc.role = KVT_ROLE_SCHEDULER;
    cc.pause_timeout_ms = 1;  // a "pause" the input asks for never holds the next call
    check(kvt_connector_create(&c, m, &cc) == KVT_OK, "connector", kvt_last_error());
    check(kvt_endpoint_open(&e, m, c, path.c_str()) == KVT_OK, "endpoint", kvt_last_error());
    // A slot whose id is not UTF-8, for slots and timeline to show.
    const uint32_t tokens[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    uint64_t n = 0;
    kvt_connector_get_num_new_matched_tokens(&n, nullptr, c, "r-\xff-1", tokens, 8, 0);
  }
  ~Served() {
    kvt_endpoint_close(e);
    kvt_connector_destroy(c);
    kvt_manager_destroy(m);
    rmdir(dir.c_str());
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static Served s;
  std::string in(reinterpret_cast<const char *>(data), size);
  if (!in.empty() && in.back() != '\n') in += '\n';
  size_t lines = 0, longest = 0;
  for (size_t at = 0, nl; (nl = in.find('\n', at)) != std::string::npos; at = nl + 1)
    ++lines, longest = std::max(longest, nl - at);
  in += "{\"cmd\":\"clear\"}\n";
  ++lines;

  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::snprintf(a.sun_path, sizeof a.sun_path, "%s", s.path.c_str());
  check(connect(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) == 0, "connect");
  std::string out;
  size_t sent = 0;
  bool eof = false;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!eof) {
    check(std::chrono::steady_clock::now() < end, "no reply within 20 s");
    pollfd p{fd, short(POLLIN | (sent < in.size() ? POLLOUT : 0)), 0};
    poll(&p, 1, 100);
    if (sent < in.size()) {
      ssize_t n = send(fd, in.data() + sent, in.size() - sent, MSG_NOSIGNAL);
      if (n > 0 && (sent += size_t(n)) == in.size()) shutdown(fd, SHUT_WR);
      if (n < 0 && errno != EAGAIN) sent = in.size();  // closed on us: a line too long
    }
    char b[65536];
    ssize_t n = read(fd, b, sizeof b);
    if (n > 0) out.append(b, size_t(n));
    else if (n == 0 || errno != EAGAIN) eof = true;
  }
  close(fd);

  size_t replies = 0;
  bool last_ok = false;
  for (size_t at = 0, nl; (nl = out.find('\n', at)) != std::string::npos; at = nl + 1) {
    const std::string line = out.substr(at, nl - at);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const std::exception &e) {
      check(false, "a reply that is not JSON:", line);
    }
    check(j.is_object(), "a reply that is not an object:", line);
    if (j.contains("event")) continue;
    check(j.contains("ok") && j["ok"].is_boolean(), "a reply without a boolean ok:", line);
    ++replies;
    last_ok = j["ok"].get<bool>();
  }
  if (longest > (64 << 10)) return 0;  // refused with one line, and closed
  check(replies == lines, "not one reply per line");
  check(last_ok, "the closing clear was refused");
  return 0;
}
