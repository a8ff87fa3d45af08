#include "observe/log_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/error.hpp"
#include "common/log.hpp"
#include "observe/log_format.hpp"

namespace kvt::obs {

namespace {

const char *kind_of(mode_t mode) {
  return S_ISLNK(mode)    ? "a symbolic link"
         : S_ISDIR(mode)  ? "a directory"
         : S_ISFIFO(mode) ? "a FIFO"
         : S_ISCHR(mode)  ? "a character device"
         : S_ISBLK(mode)  ? "a block device"
         : S_ISSOCK(mode) ? "a socket"
                          : "not a regular file";
}

kvt_status not_regular(const char *verb, const std::string &path, mode_t mode) {
  return fail(KVT_ERR_INVALID_ARGUMENT,
              "cannot %s the event log: '%s' is %s; event logs are regular files only", verb,
              path.c_str(), kind_of(mode));
}

// Opens path as a regular file into *fd, or refuses whatever else is there with
// KVT_ERR_INVALID_ARGUMENT, saying what it is. O_NONBLOCK keeps a FIFO without a peer, or a
// device, from blocking the open (and so the caller); on the regular file it is cleared
// again. With O_NOFOLLOW in flags a symbolic link as the last component is refused; links
// among the directories above it are followed, as for G3's files.
kvt_status open_regular(const std::string &path, int flags, const char *verb, int *fd) {
  const int f = ::open(path.c_str(), flags | O_NONBLOCK | O_NOCTTY | O_CLOEXEC, 0644);
  struct stat st;
  if (f < 0) {
    const int err = errno;  // ELOOP for a link, ENXIO for a FIFO without a reader, EISDIR...
    if (fstatat(AT_FDCWD, path.c_str(), &st, flags & O_NOFOLLOW ? AT_SYMLINK_NOFOLLOW : 0) == 0 &&
        !S_ISREG(st.st_mode))
      return not_regular(verb, path, st.st_mode);
    return fail(KVT_ERR_IO, "cannot %s the event log '%s': %s", verb, path.c_str(),
                std::strerror(err));
  }
  int err = 0;
  if (fstat(f, &st) != 0) {
    err = errno;
  } else if (!S_ISREG(st.st_mode)) {
    ::close(f);
    return not_regular(verb, path, st.st_mode);
  } else if (int fl = fcntl(f, F_GETFL); fl < 0 || fcntl(f, F_SETFL, fl & ~O_NONBLOCK) != 0) {
    err = errno;
  }
  if (err != 0) {
    ::close(f);
    return fail(KVT_ERR_IO, "cannot %s the event log '%s': %s", verb, path.c_str(),
                std::strerror(err));
  }
  *fd = f;
  return KVT_OK;
}

}  // namespace

LogWriter::~LogWriter() { close(); }

kvt_status LogWriter::open(const std::string &path) {
  int fd = -1;
  if (kvt_status st = open_regular(path, O_WRONLY | O_CREAT | O_NOFOLLOW, "create", &fd);
      st != KVT_OK)
    return st;
  path_ = path;
  fd_ = fd;
  std::string header;
  encode_header(&header);
  // Truncated only once known to be a regular file: the log replaces it.
  kvt_status st = ftruncate(fd_, 0) == 0
                      ? write_all(header)
                      : fail(KVT_ERR_IO, "cannot create the event log '%s': %s", path.c_str(),
                             std::strerror(errno));
  if (st != KVT_OK) {
    ::close(fd_);
    fd_ = -1;
    return st;
  }
  buf_.reserve(kRun + 1024);
  thread_ = std::thread([this] { run(); });
  open_ = true;
  return KVT_OK;
}

kvt_status LogWriter::write_all(const std::string &bytes) noexcept {
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t w = ::write(fd_, bytes.data() + done, bytes.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0)
      return fail(KVT_ERR_IO, "event log '%s': %s", path_.c_str(),
                  std::strerror(w < 0 ? errno : EIO));
    done += size_t(w);
  }
  return KVT_OK;
}

void LogWriter::run() {
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !out_.empty(); });
    if (out_.empty()) return;  // stopped, and nothing left
    lock.unlock();
    kvt_status st = write_all(out_);
    lock.lock();
    out_.clear();
    if (st != KVT_OK && !failed_) {
      error_ = last_error();
      failed_ = true;
      log(KVT_LOG_ERROR, "%s; the log stops here", error_.c_str());
    }
    cv_.notify_all();
  }
}

void LogWriter::hand_over() noexcept {
  std::lock_guard lock(mu_);
  if (!out_.empty()) return;  // still writing the last run: keep filling ours
  if (dropped_ > 0) {
    ObsEvent d;
    d.kind = KVT_OBS_DROPPED;
    d.count = dropped_;
    try {
      std::string marker;
      encode_record(d, &marker);
      buf_.insert(0, marker);
      dropped_ = 0;
    } catch (...) {  // told with the next run
    }
  }
  out_.swap(buf_);  // buf_ takes out_'s empty buffer, and its capacity
  cv_.notify_all();
}

void LogWriter::append(const ObsEvent &e) noexcept {
  if (!is_open()) return;
  if (buf_.size() >= kMaxBehind) {
    ++dropped_;
    ++dropped_total_;
  } else {
    try {
      encode_record(e, &buf_);
    } catch (...) {
      ++dropped_;
      ++dropped_total_;
    }
  }
  if (buf_.size() >= kRun) hand_over();
}

kvt_status LogWriter::close() noexcept {
  if (!open_) return KVT_OK;
  open_ = false;
  {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return out_.empty(); });
  }
  hand_over();
  {
    std::lock_guard lock(mu_);
    stop_ = true;
    cv_.notify_all();
  }
  thread_.join();
  ::close(fd_);
  fd_ = -1;
  buf_.clear();
  if (failed_) return fail(KVT_ERR_IO, "%s", error_.c_str());
  return KVT_OK;
}

LogReader::~LogReader() {
  if (f_) std::fclose(f_);
}

kvt_status LogReader::open(const std::string &path) {
  // Links are followed: reading through one harms nothing, unlike blocking on a FIFO.
  int fd = -1;
  if (kvt_status st = open_regular(path, O_RDONLY, "open", &fd); st != KVT_OK) return st;
  f_ = fdopen(fd, "rb");
  if (f_ == nullptr) {
    ::close(fd);
    return fail(KVT_ERR_IO, "cannot open the event log '%s': %s", path.c_str(),
                std::strerror(errno));
  }
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

kvt_status LogReader::next(kvt_obs_event *out, std::string *args) {
  if (done_) return fail(KVT_ERR_NOT_FOUND, "'%s': no more records", path_.c_str());
  fill(kRecordHeadBytes + kPayloadFixed + KVT_REQ_ID_MAX);
  // A CALL's arguments may make a record longer: buffer all of it (the length is checked
  // against kMaxPayload first, so that a damaged one asks for no more than that).
  if (buf_.size() - pos_ >= kRecordHeadBytes) {
    const size_t len = record_length(buf_.data() + pos_);
    if (len <= kMaxPayload) fill(kRecordHeadBytes + len);
  }
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
  Decoded d = decode_record(buf_.data() + pos_, buf_.size() - pos_, out, args, &used, &why);
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
