// parse_config: the g4_* fields of kvt_manager_config, checked, into a remote::Config.
#include <array>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <string_view>

#include "common/error.hpp"
#include "common/keyed_mac.hpp"
#include "remote/endpoint.hpp"
#include "remote/store.hpp"

namespace kvt::remote {
namespace {

constexpr uint64_t kMaxTimeoutUs = 3600ull * 1000000;  // an hour: beyond it, a mistake
constexpr size_t kMaxPrefix = 128;

std::string_view trim(std::string_view s) {
  while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  while (!s.empty() && s.back() == ' ') s.remove_suffix(1);
  return s;
}

}  // namespace

kvt_status parse_config(Config *out, const kvt_manager_config &c, uint64_t layout) {
  Config r;
  if (c.g4_url == nullptr) return fail(KVT_ERR_INVALID_ARGUMENT, "g4_url is NULL");
  std::string_view list = c.g4_url;
  // redis+cluster://a:p,b:p (each seed may repeat the scheme): a cluster's seed nodes.
  constexpr std::string_view kCluster = "redis+cluster://";
  r.cluster = trim(list).substr(0, kCluster.size()) == kCluster;
  std::set<std::string> names;
  for (size_t start = 0;;) {
    size_t comma = list.find(',', start);
    std::string_view url = trim(list.substr(start, comma == std::string_view::npos
                                                       ? std::string_view::npos
                                                       : comma - start));
    if (url.empty())
      return fail(KVT_ERR_INVALID_ARGUMENT,
                  "g4_url: \"%s\" has an empty entry: URLs separated by single commas",
                  c.g4_url);
    std::string as_url(url);
    if (r.cluster) {
      if (url.substr(0, kCluster.size()) == kCluster) url.remove_prefix(kCluster.size());
      as_url = "redis://" + std::string(url);
    }
    Endpoint e;
    if (kvt_status s = parse_endpoint(&e, as_url); s != KVT_OK) return s;
    if (r.cluster && (url.find('/') != std::string_view::npos || url.find("://") != url.npos))
      return fail(KVT_ERR_INVALID_ARGUMENT,
                  "g4_url: cluster seed \"%.*s\": host:port only (a cluster has no databases, "
                  "and every seed is redis+cluster://)", int(url.size()), url.data());
    if (!names.insert(e.name()).second)
      return fail(KVT_ERR_INVALID_ARGUMENT, "g4_url: %s %s is listed twice",
                  r.cluster ? "seed" : "shard", e.name().c_str());
    r.urls.push_back(std::move(as_url));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  if (c.g4_password_env != nullptr) {
    const char *pw = std::getenv(c.g4_password_env);
    if (pw == nullptr)
      return fail(KVT_ERR_INVALID_ARGUMENT,
                  "g4_password_env names the environment variable \"%s\", which is not set",
                  c.g4_password_env);
    if (pw[0] == '\0')
      return fail(KVT_ERR_INVALID_ARGUMENT,
                  "g4_password_env names the environment variable \"%s\", which is empty",
                  c.g4_password_env);
    r.password = pw;
  }
  if (c.g4_key_env != nullptr) {
    MacKey key;
    if (kvt_status s = read_mac_key(&key, "g4_key_env", c.g4_key_env); s != KVT_OK) return s;
    r.value_key = key;
  }
  r.key_prefix = c.g4_key_prefix != nullptr ? c.g4_key_prefix : "kvtier";
  if (r.key_prefix.empty() || r.key_prefix.size() > kMaxPrefix)
    return fail(KVT_ERR_INVALID_ARGUMENT, "g4_key_prefix has %zu bytes: 1..%zu",
                r.key_prefix.size(), kMaxPrefix);
  for (char ch : r.key_prefix)
    if (ch <= ' ' || ch > '~')
      return fail(KVT_ERR_INVALID_ARGUMENT,
                  "g4_key_prefix \"%s\": printable ASCII without spaces only",
                  r.key_prefix.c_str());
  if (r.cluster && r.key_prefix.find_first_of("{}") != std::string::npos)
    return fail(KVT_ERR_INVALID_ARGUMENT,
                "g4_key_prefix \"%s\": no braces on a Redis Cluster, where a key's first "
                "{...} is its hash tag (kvtier's is the block's hash)", r.key_prefix.c_str());
  if (c.g4_timeout_us == 0 || c.g4_timeout_us > kMaxTimeoutUs)
    return fail(KVT_ERR_INVALID_ARGUMENT, "g4_timeout_us is %llu: 1..%llu",
                static_cast<unsigned long long>(c.g4_timeout_us),
                static_cast<unsigned long long>(kMaxTimeoutUs));
  r.timeout_us = c.g4_timeout_us;
  r.ns = c.g4_namespace;
  r.layout = layout;
  *out = std::move(r);
  return KVT_OK;
}

}  // namespace kvt::remote
