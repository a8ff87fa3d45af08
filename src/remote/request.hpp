// A pipelined batch of Redis commands in RESP, built without copying block bytes: small
// pieces are formatted into one buffer and payloads are sent from where they lie (writev).
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

namespace kvt::remote {

class Request {
 public:
  // A command of small arguments (EXISTS key, GET key, AUTH pw, ...).
  void add(std::initializer_list<std::string_view> args);
  // SET key value, the value being header[0..hlen) then payload[0..plen), which is only
  // referenced: it must outlive the request's sending.
  void add_set(std::string_view key, const void *header, size_t hlen, const void *payload,
               size_t plen);
  size_t commands() const { return commands_; }
  bool empty() const { return commands_ == 0; }
  // The bytes to send, in order. Valid until the request changes.
  std::vector<iovec> iovecs() const;

 private:
  struct Piece {
    const void *outside;  // nullptr: text_[at, at + len)
    size_t at, len;
  };
  void text(std::string_view s);
  void bulk(std::string_view s);

  std::string text_;
  std::vector<Piece> pieces_;
  size_t commands_ = 0;
};

}  // namespace kvt::remote
