// The observe bus: stamps each event with its sequence number and time, and hands it to the
// subscribers' queues, the recorder's ring and the event log. on() is false while none of
// them is there, which is what keeps an idle call site at one branch.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "event/obs_sink.hpp"
#include "observe/log_file.hpp"
#include "observe/subscriber.hpp"

namespace kvt::obs {

class Bus final : public ObsSink {
 public:
  void emit(ObsEvent &e) noexcept override;
  void emit_tier_events(const kvt_event *ev, size_t n) noexcept override;

  void subscribe(std::shared_ptr<Subscriber> s);
  void unsubscribe(const Subscriber *s) noexcept;
  kvt_status set_ring(size_t events);
  // The file work of these three (open, writes, close, the writer's join) happens under
  // no lock that events take: a FIFO, a slow or a hung disk holds up their caller only.
  kvt_status dump_ring(const std::string &path);
  kvt_status open_log(const std::string &path);  // KVT_ERR_STATE while one is open
  kvt_status close_log();

  struct Counts {
    uint64_t emitted, subscriber_drops, log_drops;
  };
  Counts counts();

 private:
  void update_on_locked() noexcept;
  void stamp_locked(ObsEvent &e, uint64_t time_ns) noexcept;
  void keep_locked(const ObsEvent &e) noexcept;  // into the recorder's ring and the log
  std::unique_ptr<LogWriter> take_log_locked() noexcept;

  // Serializes open_log and close_log (so two opens cannot both win) and is held over their
  // file work; events never take it. Taken before mu_.
  std::mutex log_mu_;
  std::mutex mu_;  // a leaf: taken under tier and pipeline locks, and takes only queues'
  uint64_t seq_ = 0;
  uint64_t subscriber_drops_ = 0;
  std::vector<std::shared_ptr<Subscriber>> subs_;
  std::vector<ObsEvent> ring_;  // the last ring_.size() events, ring_next_ the oldest
  size_t ring_next_ = 0;
  uint64_t ring_filled_ = 0;
  std::unique_ptr<LogWriter> log_;  // swapped under mu_, opened and closed outside it
  uint64_t log_drops_ = 0;           // those of the logs closed
};

}  // namespace kvt::obs
