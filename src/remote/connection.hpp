// One connection to one Redis shard: a non-blocking socket of kvtier's own (remote/socket),
// requests written in place, replies read by a ReplyReader. Connecting, each batch's send
// and each reply's read must end within g4_timeout_us. Not thread-safe: a Shard lends it to
// one caller at a time.
#pragma once

#include <sys/uio.h>

#include <cstdint>
#include <memory>
#include <string>

#include "kvtier.h"
#include "remote/endpoint.hpp"
#include "remote/reply_reader.hpp"
#include "remote/request.hpp"
#include "remote/socket.hpp"

namespace kvt::remote {

class Connection {
 public:
  // Connects, then AUTH and SELECT when asked. KVT_ERR_IO with a message naming the shard
  // when it cannot be reached or refuses.
  static kvt_status open(std::unique_ptr<Connection> *out, const Endpoint &e,
                         const std::string &password, uint64_t timeout_us);
  ~Connection();
  Connection(const Connection &) = delete;
  Connection &operator=(const Connection &) = delete;

  // Sends every command of r. KVT_ERR_IO when the socket fails or the send times out.
  kvt_status send(const Request &r);
  // Sends reqs[i] on conns[i] for every i at once (remote/socket's send_all), each by its
  // connection's deadline; status[i] as send's.
  static void send_each(Connection *const *conns, const Request *const *reqs,
                        kvt_status *status, size_t n);
  // The next reply; a bulk of exactly target[0..n)'s bytes is read into them (see
  // ReplyReader::next). KVT_ERR_IO when reading fails, times out or finds bytes that are not
  // a reply: the connection must then be dropped. An error reply is a reply.
  kvt_status receive(Reply *out, const iovec *target = nullptr, int n = 0);
  // Reads a reply of another shape (CLUSTER SLOTS's arrays) with f(ReplyReader &), by the
  // same deadline; f's failure is receive's.
  template <class F>
  kvt_status read_with(F &&f) {
    source_.set_deadline(deadline());
    return f(reader_) == KVT_OK ? KVT_OK : failed();
  }

  uint64_t epoch = 0;  // the Shard's epoch when it was opened

 private:
  Connection(int fd, std::string name, uint64_t timeout_us)
      : fd_(fd), name_(std::move(name)), timeout_us_(timeout_us), source_(fd), reader_(source_) {}
  Deadline deadline() const;
  kvt_status failed() const;  // KVT_ERR_IO, the shard's name before the message

  const int fd_;
  const std::string name_;
  const uint64_t timeout_us_;
  SocketSource source_;
  ReplyReader reader_;
};

}  // namespace kvt::remote
