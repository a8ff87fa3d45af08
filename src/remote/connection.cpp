#include "remote/connection.hpp"

#include <unistd.h>

#include <string>
#include <vector>

#include "common/error.hpp"

namespace kvt::remote {
namespace {

// Puts the shard's name before the message that a lower layer left.
kvt_status on_shard(const std::string &name, kvt_status s) {
  std::string why = last_error();
  return fail(s, "G4 shard %s: %s", name.c_str(), why.c_str());
}

}  // namespace

kvt_status Connection::failed() const { return on_shard(name_, KVT_ERR_IO); }


Deadline Connection::deadline() const {
  return std::chrono::steady_clock::now() + std::chrono::microseconds(timeout_us_);
}

kvt_status Connection::open(std::unique_ptr<Connection> *out, const Endpoint &e,
                            const std::string &password, uint64_t timeout_us) {
  const std::string name = e.name();
  int fd = -1;
  if (dial(&fd, e, std::chrono::steady_clock::now() + std::chrono::microseconds(timeout_us)) !=
      KVT_OK)
    return on_shard(name, KVT_ERR_IO);
  std::unique_ptr<Connection> conn(new Connection(fd, name, timeout_us));
  Request hello;
  if (!password.empty()) hello.add({"AUTH", password});
  const std::string db = std::to_string(e.db);
  if (e.db != 0) hello.add({"SELECT", db});
  if (!hello.empty()) {
    if (kvt_status s = conn->send(hello); s != KVT_OK) return s;
    Reply r;
    for (size_t i = 0; i < hello.commands(); ++i) {
      if (kvt_status s = conn->receive(&r); s != KVT_OK) return s;
      if (r.kind == Reply::Kind::kError)
        return fail(KVT_ERR_IO, "G4 shard %s: %s refused: %s", name.c_str(),
                    !password.empty() && i == 0 ? "AUTH" : "SELECT", r.text.c_str());
    }
  }
  *out = std::move(conn);
  return KVT_OK;
}

Connection::~Connection() { close(fd_); }

kvt_status Connection::send(const Request &r) {
  Connection *self = this;
  const Request *req = &r;
  kvt_status st;
  send_each(&self, &req, &st, 1);
  return st;
}

void Connection::send_each(Connection *const *conns, const Request *const *reqs,
                           kvt_status *status, size_t n) {
  if (n == 0) return;
  std::vector<Outgoing> out(n);
  for (size_t i = 0; i < n; ++i) {
    out[i].fd = conns[i]->fd_;
    out[i].iov = reqs[i]->iovecs();
  }
  send_all(out.data(), n, conns[0]->deadline());  // one timeout for all: g4_timeout_us
  for (size_t i = 0; i < n; ++i)
    status[i] = out[i].status == KVT_OK
                    ? KVT_OK
                    : fail(KVT_ERR_IO, "G4 shard %s: %s", conns[i]->name_.c_str(),
                           out[i].error.c_str());
}

kvt_status Connection::receive(Reply *out, const iovec *target, int n) {
  source_.set_deadline(deadline());
  if (reader_.next(out, target, n) != KVT_OK) return failed();
  return KVT_OK;
}

}  // namespace kvt::remote
