#include "observe/log_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/error.hpp"
#include "common/log.hpp"
#include "observe/log_format.hpp"

namespace kvt::obs {

LogWriter::~LogWriter() { close(); }

kvt_status LogWriter::open(const std::string &path) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    return fail(KVT_ERR_IO, "cannot create the event log '%s': %s", path.c_str(),
                std::strerror(errno));
  path_ = path;
  fd_ = fd;
  buf_.clear();
  buf_.reserve(kRun + 1024);
  encode_header(&buf_);
  return flush();
}

void LogWriter::append(const kvt_obs_event &e) noexcept {
  if (fd_ < 0) return;
  try {
    encode_record(e, &buf_);
  } catch (...) {
    log(KVT_LOG_ERROR, "event log '%s': out of memory; the log stops here", path_.c_str());
    close();
    return;
  }
  if (buf_.size() >= kRun) flush();
}

kvt_status LogWriter::flush() noexcept {
  if (fd_ < 0) return KVT_OK;
  size_t done = 0;
  while (done < buf_.size()) {
    ssize_t w = ::write(fd_, buf_.data() + done, buf_.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      int err = w < 0 ? errno : EIO;
      ::close(fd_);
      fd_ = -1;
      buf_.clear();
      log(KVT_LOG_ERROR, "event log '%s': %s; the log stops here", path_.c_str(),
          std::strerror(err));
      return fail(KVT_ERR_IO, "event log '%s': %s", path_.c_str(), std::strerror(err));
    }
    done += size_t(w);
  }
  buf_.clear();
  return KVT_OK;
}

kvt_status LogWriter::close() noexcept {
  if (fd_ < 0) return KVT_OK;
  kvt_status st = flush();
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
  return st;
}

LogReader::~LogReader() {
  if (f_) std::fclose(f_);
}

kvt_status LogReader::open(const std::string &path) {
  f_ = std::fopen(path.c_str(), "rbe");
  if (f_ == nullptr)
    return fail(KVT_ERR_IO, "cannot open the event log '%s': %s", path.c_str(),
                std::strerror(errno));
  path_ = path;
  if (!fill(kLogHeaderBytes) && std::ferror(f_))
    return fail(KVT_ERR_IO, "cannot read the event log '%s'", path.c_str());
  if (kvt_status st = check_header(buf_.data(), buf_.size()); st != KVT_OK)
    return fail(st, "'%s': %s", path.c_str(), std::string(last_error()).c_str());
  pos_ = kLogHeaderBytes;
  offset_ = kLogHeaderBytes;
  return KVT_OK;
}

bool LogReader::fill(size_t need) {
  if (buf_.size() - pos_ >= need) return true;
  buf_.erase(buf_.begin(), buf_.begin() + ptrdiff_t(pos_));
  pos_ = 0;
  while (buf_.size() < need) {
    size_t at = buf_.size();
    buf_.resize(std::max(need, size_t(256) << 10));
    size_t got = std::fread(buf_.data() + at, 1, buf_.size() - at, f_);
    buf_.resize(at + got);
    if (got == 0) return false;
  }
  return true;
}

kvt_status LogReader::next(kvt_obs_event *out) {
  if (done_) return fail(KVT_ERR_NOT_FOUND, "'%s': no more records", path_.c_str());
  fill(kRecordHeadBytes + kPayloadFixed + KVT_REQ_ID_MAX);
  if (std::ferror(f_)) {
    done_ = true;
    return fail(KVT_ERR_IO, "cannot read the event log '%s'", path_.c_str());
  }
  if (pos_ == buf_.size()) {
    done_ = true;
    return fail(KVT_ERR_NOT_FOUND, "'%s': no more records", path_.c_str());
  }
  size_t used = 0;
  const char *why = "";
  Decoded d = decode_record(buf_.data() + pos_, buf_.size() - pos_, out, &used, &why);
  if (d != Decoded::Ok) {
    done_ = true;
    return fail(KVT_ERR_CORRUPT, "'%s': %s at byte %llu; the log is cut there", path_.c_str(),
                why, (unsigned long long)offset_);
  }
  pos_ += used;
  offset_ += used;
  return KVT_OK;
}

}  // namespace kvt::obs
