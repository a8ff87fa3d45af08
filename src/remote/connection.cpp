#include "remote/connection.hpp"

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <vector>

#include "common/error.hpp"

namespace kvt::remote {

kvt_status Connection::open(std::unique_ptr<Connection> *out, const Endpoint &e,
                            const std::string &password, uint64_t timeout_us) {
  timeval tv{time_t(timeout_us / 1000000), suseconds_t(timeout_us % 1000000)};
  redisContext *c = e.is_unix() ? redisConnectUnixWithTimeout(e.path.c_str(), tv)
                                : redisConnectWithTimeout(e.host.c_str(), e.port, tv);
  std::string name = e.name();
  if (c == nullptr) return fail(KVT_ERR_IO, "G4 shard %s: out of memory connecting", name.c_str());
  std::unique_ptr<Connection> conn(new Connection(c, name));
  if (c->err) return fail(KVT_ERR_IO, "G4 shard %s: cannot connect: %s", name.c_str(), c->errstr);
  if (redisSetTimeout(c, tv) != REDIS_OK)
    return fail(KVT_ERR_IO, "G4 shard %s: cannot set the timeout: %s", name.c_str(), c->errstr);
  Request hello;
  if (!password.empty()) hello.add({"AUTH", password});
  std::string db = std::to_string(e.db);
  if (e.db != 0) hello.add({"SELECT", db});
  if (!hello.empty()) {
    if (kvt_status s = conn->send(hello); s != KVT_OK) return s;
    for (size_t i = 0; i < hello.commands(); ++i) {
      Reply r;
      if (kvt_status s = conn->receive(&r); s != KVT_OK) return s;
      if (r->type == REDIS_REPLY_ERROR)
        return fail(KVT_ERR_IO, "G4 shard %s: %s refused: %.*s", name.c_str(),
                    !password.empty() && i == 0 ? "AUTH" : "SELECT", int(r->len), r->str);
    }
  }
  *out = std::move(conn);
  return KVT_OK;
}

Connection::~Connection() { redisFree(ctx_); }

kvt_status Connection::send(const Request &r) {
  std::vector<iovec> iov = r.iovecs();
  size_t i = 0;
  while (i < iov.size()) {
    msghdr m{};
    m.msg_iov = iov.data() + i;
    m.msg_iovlen = std::min<size_t>(iov.size() - i, IOV_MAX);
    ssize_t n = sendmsg(ctx_->fd, &m, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return fail(KVT_ERR_IO, "G4 shard %s: sending failed: %s", name_.c_str(),
                  errno == EAGAIN || errno == EWOULDBLOCK ? "timed out (g4_timeout_us)"
                                                          : strerror(errno));
    }
    for (size_t left = size_t(n); left > 0;) {  // skip what was sent
      if (iov[i].iov_len <= left) {
        left -= iov[i].iov_len;
        ++i;
      } else {
        iov[i].iov_base = static_cast<char *>(iov[i].iov_base) + left;
        iov[i].iov_len -= left;
        left = 0;
      }
    }
    while (i < iov.size() && iov[i].iov_len == 0) ++i;
  }
  return KVT_OK;
}

kvt_status Connection::receive(Reply *out) {
  void *r = nullptr;
  if (redisGetReply(ctx_, &r) != REDIS_OK || r == nullptr) {
    bool timeout = ctx_->err == REDIS_ERR_IO && (errno == EAGAIN || errno == EWOULDBLOCK);
    return fail(KVT_ERR_IO, "G4 shard %s: reading a reply failed: %s", name_.c_str(),
                timeout ? "timed out (g4_timeout_us)" : ctx_->errstr);
  }
  out->reset(static_cast<redisReply *>(r));
  return KVT_OK;
}

}  // namespace kvt::remote
