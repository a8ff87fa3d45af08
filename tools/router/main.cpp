// kvtier-router: subscribes to the KV events of N kvtier (or vLLM) instances and answers,
// for each request on stdin, which instance holds the longest prefix of it. See
// docs/ROUTER.md.
#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "core.hpp"
#include "kvtier.h"
#include "subscriber.hpp"

using namespace kvt::router;
using nlohmann::json;

namespace {

json answer_json(const Core &core, const Answer &a) {
  json overlap = json::object(), media = json::object();
  const std::vector<std::string> names = core.media();
  for (size_t i = 0; i < core.instances(); ++i) {
    overlap[core.name(i)] = a.overlap[i];
    json per = json::object();
    for (size_t m = 0; m < names.size() && m < a.by_medium[i].size(); ++m)
      per[names[m]] = a.by_medium[i][m];
    media[core.name(i)] = per;
  }
  return {{"blocks", a.blocks},
          {"best", a.best ? json(core.name(*a.best)) : json(nullptr)},
          {"overlap", overlap},
          {"overlap_by_medium", media}};
}

json stats_json(const Core &core) {
  json out = json::object();
  for (size_t i = 0; i < core.instances(); ++i) {
    StreamStats s = core.stats(i);
    json blocks = json::object();
    for (const std::string &m : core.media()) blocks[m] = core.hashes(i, m).size();
    out[core.name(i)] = {{"last_seq", s.last_seq ? json(*s.last_seq) : json(nullptr)},
                         {"messages", s.messages},   {"replayed", s.replayed},
                         {"duplicates", s.duplicates}, {"bad", s.bad},
                         {"lost", s.lost},           {"restarts", s.restarts},
                         {"snapshots", s.snapshots},
                         {"events", s.events},       {"last_error", s.last_error},
                         {"blocks", core.hashes(i, std::nullopt).size()},
                         {"blocks_by_medium", blocks}};
  }
  return {{"stats", out}};
}

json index_json(const Core &core) {
  json out = json::object();
  for (size_t i = 0; i < core.instances(); ++i) {
    json per = json::object();
    for (const std::string &m : core.media()) per[m] = core.hashes(i, m);
    out[core.name(i)] = per;
  }
  return {{"index", out}};
}

// One request line: {"tokens": [...]}, {"hashes": [...]}, {"stats": true} or
// {"index": true}; an "id" is echoed.
json handle(const Core &core, const std::string &line) {
  json in = json::parse(line, nullptr, false);
  if (in.is_discarded() || !in.is_object()) return {{"error", "not a JSON object"}};
  json out;
  if (in.contains("tokens")) {
    const json &t = in["tokens"];
    if (!t.is_array()) return {{"error", "\"tokens\" must be an array"}};
    std::vector<uint32_t> tokens;
    tokens.reserve(t.size());
    for (const json &x : t) {
      if (!x.is_number_unsigned() || x.get<uint64_t>() > UINT32_MAX)
        return {{"error", "\"tokens\" must hold integers in 0..4294967295"}};
      tokens.push_back(x.get<uint32_t>());
    }
    out = answer_json(core, core.route(tokens));
  } else if (in.contains("hashes")) {
    const json &h = in["hashes"];
    if (!h.is_array()) return {{"error", "\"hashes\" must be an array"}};
    std::vector<uint64_t> hashes;
    for (const json &x : h) {
      if (!x.is_number_unsigned()) return {{"error", "\"hashes\" must hold uint64 integers"}};
      hashes.push_back(x.get<uint64_t>());
    }
    out = answer_json(core, core.route_hashes(hashes));
  } else if (in.value("stats", false)) {
    out = stats_json(core);
  } else if (in.value("index", false)) {
    out = index_json(core);
  } else {
    return {{"error", "expected \"tokens\", \"hashes\", \"stats\" or \"index\""}};
  }
  if (in.contains("id")) out["id"] = in["id"];
  return out;
}

// Waits until no message has arrived for `idle` (the start counts as an arrival), at most a
// minute.
void wait_idle(const Core &core, std::chrono::milliseconds idle) {
  using Clock = std::chrono::steady_clock;
  const auto give_up = Clock::now() + std::chrono::minutes(1);
  while (Clock::now() < give_up) {
    auto quiet = Clock::now() - core.last_arrival();
    if (quiet >= idle) return;
    std::this_thread::sleep_for(idle - quiet);
  }
}

}  // namespace

int main(int argc, char **argv) {
  std::vector<std::string> instances;
  std::string salt;
  long long page = 0, idle_ms = 0;
  SubscriberOptions so;
  CLI::App app{"kvtier-router: keeps the KV events of N instances (vLLM's ZMQ format) and "
               "answers, per request line on stdin, the instance with the longest cached "
               "prefix and the overlap per instance, as JSON lines on stdout."};
  app.add_option("--instance", instances, "NAME=SUB_ENDPOINT[,REPLAY_ENDPOINT], repeatable")
      ->required();
  app.add_option("--salt", salt, "the instances' hash salt, as bytes (\"\")");
  app.add_option("--page-size", page, "the instances' tokens per block")->required();
  app.add_option("--topic", so.topic, "topic prefix to subscribe to (\"\": all)");
  app.add_option("--rcvhwm", so.rcvhwm, "messages queued per instance before ZMQ drops (100000)");
  app.add_option("--replay-timeout-ms", so.replay_timeout_ms,
                 "longest wait for one replay reply (1000)");
  app.add_option("--resync-ms", so.resync_ms, "ask a quiet instance's replay socket for what "
                 "follows its last message after this long; 0: never (1000)");
  app.add_option("--wait-idle-ms", idle_ms, "answer each line only once no event has arrived "
                                            "for this long (0)");
  CLI11_PARSE(app, argc, argv);
  if (page < 1 || page > 65536 || idle_ms < 0 || so.rcvhwm < 0 || so.replay_timeout_ms < 1 ||
      so.resync_ms < 0) {
    std::fprintf(stderr, "kvtier-router: --page-size must be in 1..65536, --wait-idle-ms, "
                         "--rcvhwm, --resync-ms >= 0, --replay-timeout-ms >= 1\n");
    return 2;
  }

  uint64_t salt_hash = 0;
  kvt_hash_salt(&salt_hash, salt.data(), salt.size());
  Core core(salt_hash, uint32_t(page));
  Subscriber sub(core, so);
  for (const std::string &arg : instances) {
    InstanceSpec spec;
    std::string err;
    if (!parse_instance(arg, &spec, &err) || !sub.add(spec, &err)) {
      std::fprintf(stderr, "kvtier-router: %s\n", err.c_str());
      return 2;
    }
  }
  sub.start();
  std::string line;
  while (std::getline(std::cin, line)) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    if (idle_ms > 0) wait_idle(core, std::chrono::milliseconds(idle_ms));
    // Media and topics come from publishers, the query from stdin: replaced where not UTF-8.
    std::cout << handle(core, line).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
              << std::endl;
  }
  sub.stop();
  return 0;
}
