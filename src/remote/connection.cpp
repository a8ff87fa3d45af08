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
  std::vector<iovec> iov = r.iovecs();
  if (send_all(fd_, iov, deadline()) != KVT_OK) return failed();
  return KVT_OK;
}

kvt_status Connection::receive(Reply *out, const iovec *target, int n) {
  source_.set_deadline(deadline());
  if (reader_.next(out, target, n) != KVT_OK) return failed();
  return KVT_OK;
}

}  // namespace kvt::remote
