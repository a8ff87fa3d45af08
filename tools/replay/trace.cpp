#include "trace.hpp"

#include <algorithm>
#include <fstream>

#include <nlohmann/json.hpp>

namespace kvt::replay {

namespace {

bool bad_line(std::string *error, const std::string &path, size_t line, const std::string &why) {
  *error = path + ":" + std::to_string(line) + ": " + why;
  return false;
}

}  // namespace

bool load_trace(const std::string &path, Trace *out, std::string *error) {
  std::ifstream in(path);
  if (!in) {
    *error = path + ": cannot open the trace file";
    return false;
  }
  Trace t;
  std::string text;
  for (size_t line = 1; std::getline(in, text); ++line) {
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;  // blank line
    nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return bad_line(error, path, line, "not a JSON value");
    if (!j.is_object()) return bad_line(error, path, line, "not a JSON object");
    auto ts = j.find("timestamp");
    if (ts == j.end() || !ts->is_number_unsigned())
      return bad_line(error, path, line, "\"timestamp\" must be a non-negative integer");
    auto ids = j.find("hash_ids");
    if (ids == j.end() || !ids->is_array())
      return bad_line(error, path, line, "\"hash_ids\" must be an array");
    Request r{ts->get<uint64_t>(), t.ids.size(), ids->size(), line};
    // Lenient, so that --mode blocks reads every trace it read before: a length that does
    // not fit the ids is replaced by the ids' own.
    const uint64_t all = r.n_ids * kTokensPerId;
    r.input_length = all;
    if (auto il = j.find("input_length"); il != j.end() && il->is_number_unsigned() &&
        il->get<uint64_t>() <= all && il->get<uint64_t>() + kTokensPerId > all)
      r.input_length = il->get<uint64_t>();
    if (auto out = j.find("output_length"); out != j.end() && out->is_number_unsigned())
      r.output_length = std::clamp<uint64_t>(out->get<uint64_t>(), 1, 1u << 24);
    for (const auto &v : *ids) {
      if (!v.is_number_unsigned() || v.get<uint64_t>() > kMaxId)
        return bad_line(error, path, line,
                        "hash_ids must hold integers in 0.." + std::to_string(kMaxId));
      t.ids.push_back(uint32_t(v.get<uint64_t>()));
    }
    t.blocks += r.n_ids;
    t.requests.push_back(r);
  }
  if (in.bad()) {
    *error = path + ": read error";
    return false;
  }
  if (t.requests.empty()) {
    *error = path + ": the trace holds no requests";
    return false;
  }
  *out = std::move(t);
  return true;
}

}  // namespace kvt::replay
