#include "remote/reply_reader.hpp"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <string_view>
#include <vector>

#include "common/error.hpp"

namespace kvt::remote {
namespace {

constexpr int kMaxTargetIov = 64;  // per read; a G4 value is two
// Read behind a value into the buffer: its CRLF and the next reply's first line, but not much
// of the next value, which then goes straight into its own target instead of through a copy.
constexpr size_t kReadBehind = 1024;

bool parse(std::string_view s, int64_t *out) {
  if (s.empty()) return false;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && end == s.data() + s.size();
}

// At most 32 bytes of what the server sent, non-printable ones escaped, for a message.
std::string excerpt(std::string_view s) {
  std::string out;
  for (unsigned char c : s.substr(0, 32)) {
    if (c >= 0x20 && c < 0x7f) {
      out += char(c);
    } else {
      char esc[5];
      std::snprintf(esc, sizeof esc, "\\x%02x", c);
      out += esc;
    }
  }
  if (s.size() > 32) out += "...";
  return out;
}

// Moves the first unfilled entry of v[*i..] on by k bytes.
void advance(std::vector<iovec> &v, size_t *i, size_t k) {
  while (k > 0) {
    size_t c = std::min(k, v[*i].iov_len);
    v[*i].iov_base = static_cast<char *>(v[*i].iov_base) + c;
    v[*i].iov_len -= c;
    k -= c;
    if (v[*i].iov_len == 0) ++*i;
  }
}

}  // namespace

ReplyReader::ReplyReader(ByteSource &src) : src_(src), buf_(new char[kBufferBytes]) {}

kvt_status ReplyReader::malformed(const char *what, std::string_view line) {
  return fail(KVT_ERR_IO, "not a reply kvtier asked for: %s (\"%s\")", what,
              excerpt(line).c_str());
}

kvt_status ReplyReader::fill() {
  if (begin_ == end_) {
    begin_ = end_ = 0;
  } else if (end_ == kBufferBytes) {  // a partial line at the end: move it to the front
    std::memmove(buf_.get(), buf_.get() + begin_, end_ - begin_);
    end_ -= begin_;
    begin_ = 0;
  }
  iovec v{buf_.get() + end_, kBufferBytes - end_};
  ssize_t r = src_.read(&v, 1);
  if (r < 0) return KVT_ERR_IO;
  if (r == 0) return fail(KVT_ERR_IO, "the server closed the connection");
  end_ += size_t(r);
  return KVT_OK;
}

kvt_status ReplyReader::line(std::string_view *out) {
  size_t scanned = 0;  // bytes after begin_ known to hold no '\n'
  for (;;) {
    const char *from = buf_.get() + begin_;
    const size_t avail = end_ - begin_;
    if (const void *nl = std::memchr(from + scanned, '\n', avail - scanned)) {
      const size_t at = size_t(static_cast<const char *>(nl) - from);
      if (at == 0 || from[at - 1] != '\r')
        return malformed("a line that does not end in CRLF", {from, at});
      if (at - 1 > kMaxLine) return malformed("a line over 4096 bytes", {from, at});
      if (std::memchr(from, '\r', at - 1) != nullptr)
        return malformed("a line with a CR inside", {from, at});
      *out = {from, at - 1};
      begin_ += at + 1;
      return KVT_OK;
    }
    if (avail > kMaxLine + 1) return malformed("a line over 4096 bytes", {from, avail});
    scanned = avail;
    if (kvt_status s = fill(); s != KVT_OK) return s;
  }
}

kvt_status ReplyReader::next(Reply *out, const iovec *target, int n) {
  return read(out, target, n, false);
}

kvt_status ReplyReader::next_element(Reply *out) { return read(out, nullptr, 0, true); }

kvt_status ReplyReader::read(Reply *out, const iovec *target, int n, bool arrays) {
  out->kind = Reply::Kind::kNil;
  out->text.clear();
  out->integer = 0;
  out->length = 0;
  out->placed = false;
  std::string_view l;
  if (kvt_status s = line(&l); s != KVT_OK) return s;
  if (l.empty()) return malformed("an empty line", l);
  const std::string_view rest = l.substr(1);
  switch (l[0]) {
    case '+':
      out->kind = Reply::Kind::kStatus;
      out->text.assign(rest);
      return KVT_OK;
    case '-':
      out->kind = Reply::Kind::kError;
      out->text.assign(rest);
      return KVT_OK;
    case ':':
      out->kind = Reply::Kind::kInteger;
      return parse(rest, &out->integer) ? KVT_OK : malformed("a malformed integer", l);
    case '$': {
      int64_t len = 0;
      if (!parse(rest, &len)) return malformed("a malformed bulk length", l);
      if (len == -1) return KVT_OK;  // nil: no such key
      if (len < 0 || uint64_t(len) > kMaxBulk) return malformed("a bulk length out of range", l);
      out->kind = Reply::Kind::kBulk;
      out->length = uint64_t(len);
      return body(out, uint64_t(len), target, n);
    }
    case '*':
      if (!arrays) return malformed("a reply type kvtier never asks for", l);
      out->kind = Reply::Kind::kArray;
      if (!parse(rest, &out->integer)) return malformed("a malformed array length", l);
      if (out->integer < -1 || out->integer > kMaxArray)
        return malformed("an array length out of range", l);
      return KVT_OK;
    default:
      return malformed("a reply type kvtier never asks for", l);
  }
}

kvt_status ReplyReader::body(Reply *out, uint64_t len, const iovec *target, int n) {
  uint64_t want = 0;
  for (int i = 0; i < n; ++i) want += target[i].iov_len;
  kvt_status s = KVT_OK;
  const bool place = n > 0 && want == len;
  if (place) {
    s = read_into(target, n, len);
  } else if (len <= kMaxLine) {
    out->text.resize(len);
    iovec v{out->text.data(), len};
    s = read_into(&v, 1, len);
  } else {
    s = skip(len);
  }
  if (s != KVT_OK) return s;
  while (end_ - begin_ < 2)
    if ((s = fill()) != KVT_OK) return s;
  if (buf_[begin_] != '\r' || buf_[begin_ + 1] != '\n')
    return malformed("a bulk not followed by CRLF", {buf_.get() + begin_, 2});
  begin_ += 2;
  out->placed = place;  // only a whole reply, CRLF included, was placed
  return KVT_OK;
}

kvt_status ReplyReader::read_into(const iovec *target, int n, uint64_t len) {
  std::vector<iovec> v;
  for (int i = 0; i < n; ++i)
    if (target[i].iov_len > 0) v.push_back(target[i]);
  size_t i = 0;
  // What the buffer holds already, then the rest straight from the source into the target,
  // with the buffer behind it for what follows (the CRLF, the next replies).
  const size_t buffered = size_t(std::min<uint64_t>(end_ - begin_, len));
  for (size_t done = 0; done < buffered;) {
    const size_t c = std::min(buffered - done, v[i].iov_len);
    std::memcpy(v[i].iov_base, buf_.get() + begin_ + done, c);
    done += c;
    advance(v, &i, c);
  }
  begin_ += buffered;
  uint64_t left = len - buffered;
  if (left == 0) return KVT_OK;
  begin_ = end_ = 0;
  std::vector<iovec> io;
  while (left > 0) {
    const size_t parts = std::min<size_t>(v.size() - i, kMaxTargetIov);
    io.assign(v.begin() + ptrdiff_t(i), v.begin() + ptrdiff_t(i + parts));
    if (i + parts == v.size()) io.push_back({buf_.get(), kReadBehind});
    ssize_t r = src_.read(io.data(), int(io.size()));
    if (r < 0) return KVT_ERR_IO;
    if (r == 0) return fail(KVT_ERR_IO, "the server closed the connection inside a value");
    if (uint64_t(r) > left) {  // the target is full; the rest is in the buffer
      end_ = size_t(uint64_t(r) - left);
      left = 0;
    } else {
      advance(v, &i, size_t(r));
      left -= uint64_t(r);
    }
  }
  return KVT_OK;
}

kvt_status ReplyReader::skip(uint64_t len) {
  for (;;) {
    const size_t c = size_t(std::min<uint64_t>(end_ - begin_, len));
    begin_ += c;
    len -= c;
    if (len == 0) return KVT_OK;
    if (kvt_status s = fill(); s != KVT_OK) return s;
  }
}

}  // namespace kvt::remote
