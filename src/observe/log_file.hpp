// Event logs on disk: a writer that appends records from the caller's thread into a buffer
// and writes full buffers on a thread of its own (a slow disk never holds up the engine),
// and a reader that returns records until the end or the first one it cannot trust.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "event/obs_sink.hpp"
#include "kvtier.h"

namespace kvt::obs {

class LogWriter {
 public:
  ~LogWriter();  // writes what is buffered
  // Creates (or replaces) the regular file at path, writes its header and starts the
  // writing thread; once per writer. Anything else at path (a symbolic link, a FIFO, a
  // device, a directory) is refused with KVT_ERR_INVALID_ARGUMENT and left as it is. Blocks
  // only its caller, on a slow disk: call it under no lock that events take.
  kvt_status open(const std::string &path);
  // Buffers e. A writer that falls 64 MiB behind loses events, and the log says how many
  // with a DROPPED record; after a failed write the log is closed (logged once).
  void append(const ObsEvent &e) noexcept;
  // Writes everything appended so far and joins the thread, which may wait on a slow disk;
  // KVT_ERR_IO if a write failed.
  kvt_status close() noexcept;
  bool is_open() const noexcept { return open_ && !failed_.load(std::memory_order_relaxed); }
  // Open, but stopped by a failed write (until close).
  bool failed() const noexcept { return open_ && failed_.load(std::memory_order_relaxed); }
  uint64_t dropped_total() const noexcept { return dropped_total_; }

 private:
  static constexpr size_t kRun = 64 << 10, kMaxBehind = 64 << 20;
  void hand_over() noexcept;  // the caller's buffer to the thread, if it is idle
  void run();
  kvt_status write_all(const std::string &bytes) noexcept;

  std::string path_;
  int fd_ = -1;
  bool open_ = false;
  std::string buf_;        // the caller's: records not yet handed over
  uint64_t dropped_ = 0;   // events lost since the last hand-over
  uint64_t dropped_total_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  std::string out_;        // the thread's: being written; empty when it is idle
  bool stop_ = false;
  std::atomic<bool> failed_{false};
  std::string error_;      // why it failed, under mu_
  std::thread thread_;
};

class LogReader {
 public:
  ~LogReader();
  // A regular file (links followed; a FIFO, a device or a directory is refused with
  // KVT_ERR_INVALID_ARGUMENT without blocking); checks the header.
  kvt_status open(const std::string &path);
  // KVT_OK; KVT_ERR_NOT_FOUND at the end; KVT_ERR_CORRUPT once at a torn or bad record.
  // args (may be null): a CALL's arguments.
  kvt_status next(kvt_obs_event *out, std::string *args = nullptr);

 private:
  bool fill(size_t need);  // at least need bytes buffered, unless the file ends first

  std::string path_;
  std::FILE *f_ = nullptr;
  std::vector<uint8_t> buf_;
  size_t pos_ = 0;         // next unread byte of buf_
  uint64_t offset_ = 0;    // file offset of buf_[pos_]
  bool done_ = false;
};

}  // namespace kvt::obs
