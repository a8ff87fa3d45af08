// RESP2 replies read from a stream that is not trusted: every line has a length limit, a
// bulk's length is checked before any of its bytes are read, and nothing grows with what the
// server sends. A bulk the caller expects (a G4 value of the block's size) is read from the
// socket straight into the caller's memory: the kernel's copy is its only one.
#pragma once

#include <sys/types.h>
#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "kvtier.h"

namespace kvt::remote {

// Where reply bytes come from: a socket, or memory in tests and the fuzzer.
class ByteSource {
 public:
  virtual ~ByteSource() = default;
  // Reads into iov[0..n) (n >= 1, every entry non-empty): the bytes read (> 0), 0 at the end
  // of the stream, or < 0 on failure with kvt_last_error() set.
  virtual ssize_t read(const iovec *iov, int n) = 0;
};

struct Reply {
  enum class Kind : uint8_t { kStatus, kError, kInteger, kNil, kBulk, kArray };
  Kind kind = Kind::kNil;
  std::string text;      // a status's or an error's words; a short bulk that was not placed
  int64_t integer = 0;   // an integer's value; an array's element count (-1: nil)
  uint64_t length = 0;   // a bulk's length
  bool placed = false;   // the bulk's bytes went into the caller's target
};

class ReplyReader {
 public:
  static constexpr size_t kMaxLine = 4096;             // a status, error, integer or length
  static constexpr uint64_t kMaxBulk = 512ull << 20;   // Redis's proto-max-bulk-len default
  static constexpr size_t kBufferBytes = 64 * 1024;    // read-ahead, allocated once
  static constexpr int64_t kMaxArray = 1 << 20;        // elements in one array header

  explicit ReplyReader(ByteSource &src);

  // The next reply into *out. A bulk whose length equals the bytes of target[0..n) is read
  // into them (placed); another is kept in text when it is at most kMaxLine bytes, else
  // skipped. A target's bytes may be written even when the bulk turns out to be another
  // length: only `placed` says they hold the reply. KVT_ERR_IO with a message when the
  // source fails or ends, or the bytes are not a RESP2 reply kvtier asks for (an array, a
  // RESP3 type, a line over kMaxLine, a malformed number, a bulk over kMaxBulk): the stream
  // is then out of step and the connection must be dropped.
  kvt_status next(Reply *out, const iovec *target = nullptr, int n = 0);
  // As next, where an array may come (CLUSTER SLOTS): an array's header is a reply of kind
  // kArray with its element count (at most kMaxArray) in integer, and its elements are the
  // next replies. The caller bounds the depth and the total it reads.
  kvt_status next_element(Reply *out);

 private:
  kvt_status read(Reply *out, const iovec *target, int n, bool arrays);
  kvt_status line(std::string_view *out);
  kvt_status fill();  // reads more into the buffer's free end
  kvt_status body(Reply *out, uint64_t len, const iovec *target, int n);
  kvt_status read_into(const iovec *target, int n, uint64_t len);
  kvt_status skip(uint64_t len);
  static kvt_status malformed(const char *what, std::string_view line);

  ByteSource &src_;
  std::unique_ptr<char[]> buf_;
  size_t begin_ = 0, end_ = 0;  // unread bytes: buf_[begin_, end_)
};

}  // namespace kvt::remote
