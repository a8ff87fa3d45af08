// G4's sockets: connect, send and receive on a non-blocking socket, each bounded by a
// deadline, so that no server can hold a caller longer than g4_timeout_us per step.
#pragma once

#include <sys/uio.h>

#include <chrono>
#include <string>
#include <vector>

#include "kvtier.h"
#include "remote/endpoint.hpp"
#include "remote/reply_reader.hpp"
#include "remote/resolve.hpp"

namespace kvt::remote {

// Connects to e by the deadline: *fd is a non-blocking, close-on-exec stream socket
// (TCP_NODELAY for TCP). KVT_ERR_IO with the reason ("cannot connect: ...") otherwise.
kvt_status dial(int *fd, const Endpoint &e, Deadline d);

// One socket's bytes for send_all.
struct Outgoing {
  int fd = -1;
  std::vector<iovec> iov;  // consumed as it goes
  size_t at = 0;           // the first entry with bytes left
  kvt_status status = KVT_OK;
  std::string error;       // why it failed
};
// Sends every byte of out[0..n) by the deadline, with MSG_NOSIGNAL (a server that went away
// is KVT_ERR_IO, never a SIGPIPE), writing to whichever socket has room: each server gets
// its batch while the others' are still being written, and one server's full socket never
// holds the rest back. One that fails or runs out of time gets KVT_ERR_IO and its message;
// the others go on.
void send_all(Outgoing *out, size_t n, Deadline d);

// Reply bytes from a socket, by a deadline its owner sets before each reply.
class SocketSource final : public ByteSource {
 public:
  explicit SocketSource(int fd) : fd_(fd) {}
  void set_deadline(Deadline d) { deadline_ = d; }
  ssize_t read(const iovec *iov, int n) override;

 private:
  int fd_;
  Deadline deadline_{};
};

}  // namespace kvt::remote
