// fuzz_resp_reader: G4's RESP reader (src/remote/reply_reader.cpp, compiled in) on bytes as a
// Redis server, or anything posing as one, could send. The input is: the size of the cuts
// the source makes (1 byte), the size of the two-part target a bulk may be placed into
// (2 bytes), then the stream. Replies are read until one is refused or the stream ends; a
// refusal must be KVT_ERR_IO with a message, and an accepted reply must be what it says.
#include <sys/uio.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "chunked_source.hpp"
#include "remote/reply_reader.hpp"

using kvt::remote::Reply;
using kvt::remote::ReplyReader;

namespace {

void check(bool ok, const char *what) {
  if (ok) return;
  std::fprintf(stderr, "fuzz_resp_reader: %s (%s)\n", what, kvt::last_error());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 3) return 0;
  const size_t chunk = data[0] == 0 ? size : data[0];
  const size_t want = size_t(data[1] | (data[2] << 8));
  kvt_fuzz::ChunkedSource src(data + 3, size - 3, chunk);
  ReplyReader reader(src);
  std::vector<uint8_t> head(std::min<size_t>(want, 64)), body(want - head.size());
  iovec target[2] = {{head.data(), head.size()}, {body.data(), body.size()}};
  Reply r;
  for (size_t replies = 0;; ++replies) {
    check(replies <= size, "more replies than bytes");
    kvt_status s = reader.next(&r, target, 2);
    if (s != KVT_OK) {
      check(s == KVT_ERR_IO, "a refusal that is not KVT_ERR_IO");
      check(kvt::last_error()[0] != '\0', "a refusal without a message");
      check(!r.placed, "a refused reply said it was placed");
      return 0;
    }
    check(src.at() <= size - 3, "read past the stream");
    switch (r.kind) {
      case Reply::Kind::kStatus:
      case Reply::Kind::kError:
        check(r.text.size() <= ReplyReader::kMaxLine, "a line over the limit");
        check(r.text.find_first_of("\r\n") == std::string::npos, "a line holds CR or LF");
        break;
      case Reply::Kind::kBulk:
        check(r.length <= ReplyReader::kMaxBulk, "a bulk over the limit");
        if (r.placed) check(r.length == want, "placed a bulk of another size");
        else if (r.length <= ReplyReader::kMaxLine) check(r.text.size() == r.length, "a short bulk not kept");
        else check(r.text.empty(), "a long bulk kept");
        break;
      case Reply::Kind::kArray:  // never from next()
        check(false, "next() returned an array");
        break;
      case Reply::Kind::kInteger:
      case Reply::Kind::kNil:
        check(!r.placed && r.text.empty(), "a number with bytes");
        break;
    }
  }
}
