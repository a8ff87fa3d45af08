// One connection to one Redis shard (hiredis, blocking, with timeouts). Requests are written
// with sendmsg(MSG_NOSIGNAL), so that a server that went away is an error and never a
// SIGPIPE; hiredis parses the replies. Not thread-safe: a Shard lends it to one caller at a
// time.
#pragma once

#include <hiredis.h>

#include <cstdint>
#include <memory>
#include <string>

#include "kvtier.h"
#include "remote/endpoint.hpp"
#include "remote/request.hpp"

namespace kvt::remote {

struct ReplyFree {
  void operator()(redisReply *r) const { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyFree>;

class Connection {
 public:
  // Connects (within timeout_us), then AUTH and SELECT when asked. KVT_ERR_IO with a message
  // naming the shard when it cannot be reached or refuses.
  static kvt_status open(std::unique_ptr<Connection> *out, const Endpoint &e,
                         const std::string &password, uint64_t timeout_us);
  ~Connection();
  Connection(const Connection &) = delete;
  Connection &operator=(const Connection &) = delete;

  // Sends every command of r. KVT_ERR_IO when the socket fails or a write times out.
  kvt_status send(const Request &r);
  // The next reply; KVT_ERR_IO when reading fails or times out. An error reply is a reply.
  kvt_status receive(Reply *out);

  uint64_t epoch = 0;  // the Shard's epoch when it was opened

 private:
  Connection(redisContext *c, std::string name) : ctx_(c), name_(std::move(name)) {}
  redisContext *ctx_;
  std::string name_;
};

}  // namespace kvt::remote
