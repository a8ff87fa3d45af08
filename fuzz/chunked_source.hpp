// A Redis reply stream made of a fuzzer's bytes, handed out at most `chunk` bytes a read and
// scattered over the iovecs as readv would: the cuts a socket may make anywhere.
#pragma once

#include <sys/uio.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "remote/reply_reader.hpp"

namespace kvt_fuzz {

class ChunkedSource final : public kvt::remote::ByteSource {
 public:
  ChunkedSource(const uint8_t *p, size_t n, size_t chunk) : p_(p), n_(n), chunk_(chunk) {}
  ssize_t read(const iovec *iov, int n) override {
    if (n < 1) misuse("a read of no iovec");
    size_t left = std::min(chunk_, n_ - at_), done = 0;
    for (int i = 0; i < n && left > 0; ++i) {
      if (iov[i].iov_len == 0) misuse("an empty iovec");
      size_t c = std::min(left, iov[i].iov_len);
      std::memcpy(iov[i].iov_base, p_ + at_, c);
      at_ += c, done += c, left -= c;
    }
    return ssize_t(done);
  }
  size_t at() const { return at_; }  // bytes handed out so far

 private:
  [[noreturn]] static void misuse(const char *what) {
    std::fprintf(stderr, "the reply reader made %s\n", what);
    std::abort();
  }
  const uint8_t *p_;
  size_t n_, chunk_, at_ = 0;
};

}  // namespace kvt_fuzz
