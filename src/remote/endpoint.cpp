#include "remote/endpoint.hpp"

#include <cctype>
#include <charconv>
#include <string>

#include "common/error.hpp"

namespace kvt::remote {
namespace {

constexpr int kDefaultPort = 6379;

// A decimal in [lo, hi], all of s.
bool number(std::string_view s, long lo, long hi, int *out) {
  long v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size() || v < lo || v > hi)
    return false;
  *out = int(v);
  return true;
}

kvt_status bad(std::string_view url, const char *why) {
  return fail(KVT_ERR_INVALID_ARGUMENT, "g4_url: \"%.*s\": %s", int(url.size()), url.data(),
              why);
}

kvt_status parse_unix(Endpoint *out, std::string_view url, std::string_view rest) {
  std::string_view query;
  if (size_t q = rest.find('?'); q != std::string_view::npos) {
    query = rest.substr(q + 1);
    rest = rest.substr(0, q);
  }
  if (rest.empty() || rest[0] != '/')
    return bad(url, "a Unix socket's path must be absolute: unix:///path/to/redis.sock");
  if (rest.size() == 1) return bad(url, "the Unix socket's path is empty");
  if (!query.empty()) {
    if (query.substr(0, 3) != "db=")
      return bad(url, "the only query a unix:// URL takes is ?db=N");
    if (!number(query.substr(3), 0, 1 << 30, &out->db))
      return bad(url, "db must be a number from 0");
  }
  out->path = std::string(rest);
  return KVT_OK;
}

kvt_status parse_tcp(Endpoint *out, std::string_view url, std::string_view rest) {
  std::string_view authority = rest, db;
  if (size_t slash = rest.find('/'); slash != std::string_view::npos) {
    authority = rest.substr(0, slash);
    db = rest.substr(slash + 1);
    if (!db.empty() && !number(db, 0, 1 << 30, &out->db))
      return bad(url, "the path must be a database number: redis://host:port/N");
  }
  if (authority.find('@') != std::string_view::npos)
    return bad(url, "credentials in the URL are not accepted: name an environment variable "
                    "holding the password in g4_password_env");
  if (authority.find('?') != std::string_view::npos)
    return bad(url, "redis:// URLs take no query");
  std::string_view host = authority, port;
  if (!authority.empty() && authority[0] == '[') {  // [IPv6]:port
    size_t close = authority.find(']');
    if (close == std::string_view::npos) return bad(url, "an IPv6 address lacks its ']'");
    host = authority.substr(1, close - 1);
    std::string_view after = authority.substr(close + 1);
    if (!after.empty()) {
      if (after[0] != ':') return bad(url, "expected ':port' after the IPv6 address");
      port = after.substr(1);
      if (port.empty()) return bad(url, "the port after ':' is empty");
    }
  } else if (size_t colon = authority.rfind(':'); colon != std::string_view::npos) {
    host = authority.substr(0, colon);
    port = authority.substr(colon + 1);
    if (port.empty()) return bad(url, "the port after ':' is empty");
  }
  if (host.empty()) return bad(url, "the host is empty: redis://host:port[/db]");
  for (char ch : host)
    if (!(isalnum(static_cast<unsigned char>(ch)) || ch == '.' || ch == '-' || ch == '_' ||
          ch == ':'))
      return bad(url, "the host has a character that is not allowed in a name or address");
  out->port = kDefaultPort;
  if (!port.empty() && !number(port, 1, 65535, &out->port))
    return bad(url, "the port must be a number from 1 to 65535");
  out->host = std::string(host);
  return KVT_OK;
}

}  // namespace

std::string Endpoint::name() const {
  if (is_unix()) return "unix://" + path + "?db=" + std::to_string(db);
  bool v6 = host.find(':') != std::string::npos;
  return "redis://" + (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port) + "/" +
         std::to_string(db);
}

kvt_status parse_endpoint(Endpoint *out, std::string_view url) {
  *out = Endpoint{};
  constexpr std::string_view kRedis = "redis://", kUnix = "unix://";
  if (url.substr(0, kRedis.size()) == kRedis)
    return parse_tcp(out, url, url.substr(kRedis.size()));
  if (url.substr(0, kUnix.size()) == kUnix) return parse_unix(out, url, url.substr(kUnix.size()));
  if (url.substr(0, 9) == "rediss://")
    return bad(url, "TLS (rediss://) is not supported: use redis:// or unix://");
  return bad(url, "expected redis://host:port[/db], unix:///path[?db=N], or a list that begins "
                  "with redis+cluster://host:port");
}

}  // namespace kvt::remote
