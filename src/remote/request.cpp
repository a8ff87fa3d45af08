#include "remote/request.hpp"

namespace kvt::remote {

void Request::text(std::string_view s) {
  if (!pieces_.empty() && pieces_.back().outside == nullptr)
    pieces_.back().len += s.size();
  else
    pieces_.push_back({nullptr, text_.size(), s.size()});
  text_.append(s);
}

void Request::bulk(std::string_view s) {
  text("$" + std::to_string(s.size()) + "\r\n");
  text(s);
  text("\r\n");
}

void Request::add(std::initializer_list<std::string_view> args) {
  text("*" + std::to_string(args.size()) + "\r\n");
  for (std::string_view a : args) bulk(a);
  ++commands_;
}

void Request::add_set(std::string_view key, const void *header, size_t hlen,
                      const void *payload, size_t plen) {
  text("*3\r\n");
  bulk("SET");
  bulk(key);
  text("$" + std::to_string(hlen + plen) + "\r\n");
  text(std::string_view(static_cast<const char *>(header), hlen));
  if (plen > 0) pieces_.push_back({payload, 0, plen});
  text("\r\n");
  ++commands_;
}

std::vector<iovec> Request::iovecs() const {
  std::vector<iovec> v;
  v.reserve(pieces_.size());
  for (const Piece &p : pieces_)
    v.push_back({const_cast<void *>(p.outside ? p.outside : text_.data() + p.at), p.len});
  return v;
}

}  // namespace kvt::remote
