// kvt_event_log_rerun: a log's CALL events made again, with their recorded arguments, on a
// fresh scheduler half, while LogReplay checks the log's own events; at the end the fresh
// scheduler and manager must hold the state those events describe.
#pragma once

#include <absl/container/flat_hash_map.h>

#include <cstdint>
#include <string>
#include <vector>

#include "connector/log_replay.hpp"
#include "kvtier.h"

namespace kvt {
class Manager;
}

namespace kvt::conn {

class Scheduler;

class LogRerun {
 public:
  LogRerun(Scheduler &s, Manager &m) : s_(s), m_(m), events_(nullptr) {}
  void apply(const kvt_obs_event &e, const std::string &args);
  // Compares the end states; the counts into *out (differences count as violations), the
  // first violation or difference into *first.
  void finish(kvt_log_replay *out, std::string *first);

 private:
  void call(const kvt_obs_event &e, const std::string &args);

  Scheduler &s_;
  Manager &m_;
  LogReplay events_;  // the log's events, checked, without a manager; and what differs
  // Each live request's tokens, as its slot has them: for the calls logged with the slot's
  // own tokens (CallArgs::own_tokens).
  absl::flat_hash_map<std::string, std::vector<uint32_t>> tokens_;
  uint64_t calls_ = 0;
};

}  // namespace kvt::conn
