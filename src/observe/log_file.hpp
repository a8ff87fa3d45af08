// Event logs on disk: a writer that appends records in 64 KiB runs, and a reader that
// returns records until the end or the first one it cannot trust.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "kvtier.h"

namespace kvt::obs {

class LogWriter {
 public:
  ~LogWriter();  // writes what is buffered
  // Creates (or replaces) the file and writes its header; the error set on failure.
  kvt_status open(const std::string &path);
  // Buffers e; a failed write closes the log (logged once) and later appends are ignored.
  void append(const kvt_obs_event &e) noexcept;
  kvt_status flush() noexcept;
  kvt_status close() noexcept;
  bool is_open() const noexcept { return fd_ >= 0; }

 private:
  static constexpr size_t kRun = 64 << 10;
  std::string path_;
  std::string buf_;
  int fd_ = -1;
};

class LogReader {
 public:
  ~LogReader();
  kvt_status open(const std::string &path);  // checks the header
  // KVT_OK; KVT_ERR_NOT_FOUND at the end; KVT_ERR_CORRUPT once at a torn or bad record.
  kvt_status next(kvt_obs_event *out);

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
